"""Tiny hybrid models (attention + recurrent layers) on real vLLM CPU with prefix caching
(`--mamba-cache-mode align`): Qwen3-Next (gated delta-net linear attention) and LFM2 (short
convolutions). Opt-in: needs the models (`TINY_HYBRID=1 .ci/setup_vllm.sh`), since each costs
another worker start (~40 s-2 min here)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from vllm_helpers import REPO, VLLM_PYTHON, free_ports, vllm_skip_reason

from agentbatch.engines.metrics import scrape
from agentbatch.engines.openai_http import OpenAIEngine
from agentbatch.engines.vllm_workers import WorkerCluster, WorkersConfig
from agentbatch.protocols.engine import ChatRequest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

CASES = {
    # vLLM sizes the attention block so a page holds one recurrent state (640 tokens for this
    # Qwen3-Next: fp32 SSM state). In align mode a state checkpoint is kept where a prefill chunk
    # ends on a block boundary, so a one-block token budget checkpoints every block (with a bigger
    # budget a prompt prefilled in one chunk leaves no checkpoint to hit).
    "qwen3-next": {"max_num_batched_tokens": 640},
    # LFM2's convolution state is small: the CPU's 128-token block holds it, and hits come at once.
    "lfm2": {"max_num_batched_tokens": 2048},
}


@pytest.mark.parametrize("arch", sorted(CASES))
def test_hybrid_model_serves_with_prefix_caching(arch, tmp_path):
    model = REPO / ".cache" / f"tiny-{arch}"
    if reason := vllm_skip_reason(model):
        pytest.skip(reason.replace("run .ci/setup_vllm.sh", "run TINY_HYBRID=1 .ci/setup_vllm.sh"))
    (port,) = free_ports(1)
    cfg = WorkersConfig.model_validate({
        "model": str(model), "served_model_name": "tiny-hybrid", "python": str(VLLM_PYTHON), "device": "cpu",
        "log_dir": str(tmp_path), "endpoints_file": str(tmp_path / "ep.json"), "startup_timeout_s": 400,
        "workers": [{"name": "h0", "port": port}],
        "settings": {"max_num_seqs": 4, "max_model_len": 4096, "mamba_cache_mode": "align", "block_size": None,
                     **CASES[arch]},
    })
    vocab = "the file directory list move copy read write search ticket".split()
    prefix = " ".join(vocab[i % len(vocab)] for i in range(1500))
    with WorkerCluster(cfg) as cluster:
        (ep,) = cluster.endpoints

        async def run():
            engine = OpenAIEngine(ep.name, ep.base_url, ep.model)
            out = []
            for i in range(2):
                msgs = [{"role": "system", "content": prefix}, {"role": "user", "content": f"q {i}"}]
                out.append(await engine.complete(ChatRequest(messages=msgs, tools=[], priority=i,
                                                             max_tokens=4, ignore_eos=True)))
            await engine.aclose()
            async with httpx.AsyncClient() as client:
                return out, await scrape(client, ep.name, ep.base_url)

        (first, second), metrics = asyncio.run(run())
    block = metrics.block_size
    assert metrics.cache_config["mamba_cache_mode"] == "align" and block
    assert not first.cached_prompt_tokens
    assert second.cached_prompt_tokens >= block and second.cached_prompt_tokens % block == 0
    assert metrics.prefix_cache_hits == second.cached_prompt_tokens
