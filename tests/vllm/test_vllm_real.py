"""Real vLLM CPU workers serving the tiny local model: launcher up/down (one worker, then two),
prefix-cache hits in the scraped metrics, per-request priority, no orphans after down.

Needs .venv-vllm and .cache/tiny-llama (`.ci/setup_vllm.sh`). Starting a worker takes ~50 s on
2 cores, so the module starts one worker with the CLI, a second one through the API, and shares
them between its tests.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import pytest
import yaml
from vllm_helpers import REPO, TINY_MODEL, VLLM_PYTHON, free_ports, processes_with, vllm_skip_reason

from agentbatch.db.metrics_models import worker_metrics
from agentbatch.db.models import Worker
from agentbatch.db.store import Store
from agentbatch.db.trace_io import export_batch
from agentbatch.engines.metrics import MetricsScraper, scrape
from agentbatch.engines.openai_http import OpenAIEngine
from agentbatch.engines.vllm_workers import (
    WorkerCluster,
    WorkersConfig,
    group_alive,
    probe,
    read_endpoints,
    read_processes,
)
from agentbatch.flows.batch import create_batch, execute_batch, launch_batch
from agentbatch.flows.config import BatchConfig
from agentbatch.flows.launch import prepare_launch
from agentbatch.protocols.engine import ChatRequest
from agentbatch.traces.parquet import read_trace, write_trace

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.xdist_group("vllm_real")]  # one set of workers

if reason := vllm_skip_reason():
    pytest.skip(reason, allow_module_level=True)

BLOCK = 128  # vLLM's CPU block size: prefix hits come in multiples of it
MAX_LEN = 16384  # BFCL tool schemas alone are ~7k tokens of the tiny tokenizer


def _config(tmp, port: int, name: str) -> dict:
    return {
        "model": str(TINY_MODEL), "served_model_name": "tiny", "python": str(VLLM_PYTHON), "count": 1,
        "device": "cpu", "name_prefix": name, "log_dir": str(tmp / "logs"),
        "endpoints_file": str(tmp / f"{name}.json"), "startup_timeout_s": 300,
        "workers": [{"name": name, "port": port}],
        "settings": {"max_num_seqs": 8, "block_size": BLOCK, "max_model_len": MAX_LEN, "kv_cache_space_gib": 1},
    }


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentbatch.flows.cli", *args], cwd=REPO, text=True,
                          capture_output=True, timeout=400)


class Workers:
    """The module's workers: w0 started by `agentbatch workers up`, w1 by WorkerCluster."""

    def __init__(self, tmp) -> None:
        self.tmp = tmp
        self.ports = free_ports(2)
        self.cfg0 = tmp / "w0.yaml"
        self.cfg0.write_text(yaml.safe_dump(_config(tmp, self.ports[0], "w0")))
        self.endpoints0 = tmp / "w0.json"
        self.cluster1: WorkerCluster | None = None
        self.pgids: list[int] = []

    def up_first(self) -> None:
        r = _cli("workers", "up", str(self.cfg0))
        assert r.returncode == 0, r.stdout + r.stderr
        self.pgids += [p.pgid for p in read_processes(self.endpoints0)]

    def up_second(self) -> WorkerCluster:
        if self.cluster1 is None:
            self.cluster1 = WorkerCluster(WorkersConfig.model_validate(_config(self.tmp, self.ports[1], "w1")))
            self.cluster1.up()
            self.pgids += [w.pgid for w in self.cluster1.workers]
        return self.cluster1

    def endpoints(self) -> list[dict]:
        eps = json.loads(self.endpoints0.read_text())
        if self.cluster1 is not None:
            eps += [{"name": e.name, "base_url": e.base_url, "model": e.model} for e in self.cluster1.endpoints]
        return eps

    def down(self) -> dict[str, str]:
        result: dict[str, str] = {}
        if (self.tmp / "w0.json.procs.json").exists():
            r = _cli("workers", "down", str(self.endpoints0))
            assert r.returncode == 0, r.stdout + r.stderr
            result.update(dict(line.split("\t") for line in r.stdout.strip().splitlines()))
        if self.cluster1 is not None:
            result.update(self.cluster1.down())
            self.cluster1 = None
        return result


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    w = Workers(tmp_path_factory.mktemp("vllm"))
    w.up_first()
    yield w
    w.down()  # a no-op when test_down_leaves_no_orphans ran


def _long_prefix(words: int = 700) -> str:
    # Words the tiny tokenizer knows: about one token each, so the prompt stays under max_model_len.
    vocab = "the file directory list move copy read write search ticket".split()
    return " ".join(vocab[i % len(vocab)] for i in range(words))


def test_first_worker_is_up_and_listed(workers):
    (ep,) = read_endpoints(workers.endpoints0)
    assert ep.name == "w0" and ep.model == "tiny" and ep.base_url == f"http://127.0.0.1:{workers.ports[0]}/v1"
    info = probe(ep.base_url)
    assert info["healthy"] and info["models"] == ["tiny"] and info["max_model_len"] == MAX_LEN
    r = _cli("workers", "list", ep.base_url)
    assert r.returncode == 0 and "healthy" in r.stdout


def test_prefix_cache_hits_show_in_metrics_and_priority_is_accepted(workers):
    (ep,) = workers.endpoints()[:1]

    async def run():
        engine = OpenAIEngine(ep["name"], ep["base_url"], ep["model"])
        async with httpx.AsyncClient() as client:
            before = await scrape(client, ep["name"], ep["base_url"])
            prefix = _long_prefix()
            results = []
            for i, prio in enumerate((5, -3)):  # lower runs first under --scheduling-policy priority
                msgs = [{"role": "system", "content": prefix}, {"role": "user", "content": f"question {i}"}]
                results.append(await engine.complete(ChatRequest(messages=msgs, tools=[], priority=prio,
                                                                 max_tokens=6, ignore_eos=True)))
            after = await scrape(client, ep["name"], ep["base_url"])
        await engine.aclose()
        return before, results, after

    before, results, after = asyncio.run(run())
    assert before.ok and after.ok and after.block_size == BLOCK
    first, second = results
    assert first.output_tokens == second.output_tokens == 6  # ignore_eos + max_tokens force the length
    assert first.prompt_tokens > 4 * BLOCK
    d = after.delta(before)
    assert d.prefix_cache_queries == first.prompt_tokens + second.prompt_tokens
    # The second request finds the shared prefix's full blocks cached (at most its length).
    full_blocks = (first.prompt_tokens - 20) // BLOCK
    assert d.prefix_cache_hits >= full_blocks * BLOCK and d.prefix_cache_hits % BLOCK == 0
    assert second.cached_prompt_tokens == d.prefix_cache_hits  # per request, from prompt_tokens_details
    assert after.running == 0 and after.waiting == 0


def test_priority_is_rejected_when_out_of_range_and_tools_are_accepted(workers):
    # vLLM refuses a non-zero priority unless the server runs --scheduling-policy priority (its API
    # docs), so acceptance shows the policy is on; a malformed one is refused: the field is read.
    url = workers.endpoints()[0]["base_url"] + "/chat/completions"
    base = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    tools = [{"type": "function", "function": {"name": "ls", "description": "list files",
                                               "parameters": {"type": "object", "properties": {}}}}]
    ok = httpx.post(url, json={**base, "priority": 2, "tools": tools}, timeout=120)
    assert ok.status_code == 200, ok.text
    bad = httpx.post(url, json={**base, "priority": "urgent"}, timeout=120)
    assert bad.status_code == 400


def test_second_worker_and_metrics_scraper_over_both(workers, tmp_path):
    workers.up_second()
    eps = workers.endpoints()
    assert [e["name"] for e in eps] == ["w0", "w1"]
    store = Store(f"sqlite:///{tmp_path / 'm.sqlite'}")
    batch_id = store.create_batch("vllm-metrics", {}, [("t", {})])

    async def run() -> MetricsScraper:
        engines = [OpenAIEngine(e["name"], e["base_url"], e["model"]) for e in eps]
        prefix = _long_prefix(500)
        async with MetricsScraper({e["name"]: e["base_url"] for e in eps}, interval_s=0.5,
                                  store=store, batch_id=batch_id) as scraper:
            while scraper.rounds < 1:
                await asyncio.sleep(0.1)
            for rep in range(2):  # the same prefix twice on each worker: the second is a hit
                await asyncio.gather(*(en.complete(ChatRequest(
                    messages=[{"role": "user", "content": f"{prefix} {en.name} {rep}"}], tools=[],
                    priority=rep, max_tokens=4, ignore_eos=True)) for en in engines))
        for en in engines:
            await en.aclose()
        return scraper

    scraper = asyncio.run(run())
    for e in eps:
        d = scraper.latest[e["name"]].delta(scraper.baseline[e["name"]])
        assert d.prefix_cache_hits >= 3 * BLOCK, (e["name"], d)
        series = worker_metrics(store, batch_id, e["name"])
        assert len(series) >= 2 and series[-1]["prefix_cache_hits"] > series[0]["prefix_cache_hits"]
    store.close()


def _record_bfcl_trace(tmp) -> str:
    """A recorded BFCL batch (scripted ground-truth agent, real bfcl backends), exported as a trace."""
    store = Store(f"sqlite:///{tmp / 'record.sqlite'}")
    cfg = BatchConfig.model_validate({
        "name": "bfcl-record",
        "workload": {"kind": "bfcl", "params": {"limit": 4, "seed": 3, "categories": ["multi_turn_base"]}},
        "engine": {"kind": "scripted", "params": {"workers": 2, "timing": {"kind": "token", "scale": 0.05}}},
        "scheduling": {"max_active_samples": 4, "env_slots": 2, "per_worker_inflight": 4},
    })
    batch_id = create_batch(cfg, store)
    asyncio.run(execute_batch(store, batch_id, use_prefect=False, show_progress=False))
    path = write_trace(export_batch(store, batch_id), tmp / "bfcl.parquet")
    store.close()
    return str(path)


@pytest.mark.usefixtures("prefect_api")
def test_controlled_replay_of_a_bfcl_trace_through_two_workers(workers, tmp_path):
    """The issue's "done when": recorded BFCL trace, replayed by the batch flow with real inference
    on two vLLM workers (replay engine over the openai engine), trajectory-aware routing and
    chain-progress priorities; stickiness in the store, prefix hits in the scraped metrics."""
    workers.up_second()
    trace = _record_bfcl_trace(tmp_path)
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps(workers.endpoints()))
    store = Store(f"sqlite:///{tmp_path / 'replay.sqlite'}")
    cfg = BatchConfig.model_validate({
        "name": "bfcl-replay-vllm",
        "workload": {"kind": "recorded", "params": {"trace": trace, "time_scale": 0.2}},
        "engine": {"kind": "replay", "params": {"endpoints": str(endpoints), "timeout_s": 300}},
        "scheduling": {"max_active_samples": 4, "env_slots": 2, "per_worker_inflight": 4,
                       "router": {"name": "trajectory_aware"}, "priority": {"name": "chain_progress"}},
    })
    batch_id = create_batch(cfg, store)

    async def run() -> MetricsScraper:
        eps = {e["name"]: e["base_url"] for e in workers.endpoints()}
        async with MetricsScraper(eps, interval_s=1.0, store=store, batch_id=batch_id) as scraper:
            await launch_batch(store, batch_id, api=prepare_launch(), show_progress=False)
        return scraper

    scraper = asyncio.run(run())
    samples = store.samples(batch_id)
    steps = store.steps(batch_id)
    assert all(s.status == "completed" for s in samples), [(s.task_id, s.error) for s in samples]
    assert not [st for st in steps if st.status != "completed"]
    recorded = {s.task_id: s.score for s in read_trace(trace).samples}
    assert {s.task_id: s.score for s in samples} == recorded  # scores are the recording's

    inference = [st for st in steps if st.kind == "inference"]
    assert {st.worker for st in inference} == {"w0", "w1"}
    # Stickiness: a sample's consecutive inference steps stay on one worker.
    pairs = same = 0
    for s in samples:
        ws = [st.worker for st in sorted(inference, key=lambda st: st.index) if st.sample_id == s.id]
        pairs += len(ws) - 1
        same += sum(a == b for a, b in zip(ws, ws[1:], strict=False))
    assert pairs > 0 and same / pairs >= 0.9, (same, pairs)
    # Prefix reuse: every later step of a sample finds most of its prompt cached (real vLLM usage).
    later = [st for st in inference if st.index > 0]
    assert sum(st.cached_prompt_tokens or 0 for st in later) >= 0.5 * sum(st.prompt_tokens for st in later)
    # Priorities from chain progress reached the engine (recorded with the request; vLLM accepted them).
    prios = [st.request["priority"] for st in inference]
    assert all(isinstance(p, int) for p in prios) and len(set(prios)) > 1
    # Real metrics: hits on both workers in the scraped series and in the workers table.
    for name in ("w0", "w1"):
        d = scraper.latest[name].delta(scraper.baseline[name])
        assert d.prefix_cache_hits > 0 and d.prefix_cache_hits % BLOCK == 0
        assert worker_metrics(store, batch_id, name)
    with store.session() as sess:
        rows = {w.name: w for w in sess.query(Worker).filter_by(batch_id=batch_id)}
    assert rows["w0"].metrics["batch_delta"]["prefix_cache_hits"] > 0
    store.close()


def test_down_leaves_no_orphans(workers):
    # Both workers up whatever ran before (a worker of xdist may run this test first or alone).
    workers.up_second()
    assert len(workers.pgids) == 2
    assert all(group_alive(g) for g in workers.pgids)
    result = workers.down()
    assert result == {"w0": "stopped", "w1": "stopped"}  # SIGTERM was enough: no SIGKILL needed
    assert not any(group_alive(g) for g in workers.pgids)
    assert not processes_with(str(TINY_MODEL)), processes_with(str(TINY_MODEL))
