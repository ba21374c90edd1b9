"""Transcripts read back from the store: runner and gateway formats, `agentbatch show`, folding and
inert terminal output, and a real batch's transcripts matching its recorded steps."""

from __future__ import annotations

import subprocess
import sys

import pytest
from dashboards_batches import write_batch
from transcript_batches import HOSTILE, LONG, gateway_samples, write_runner

from agentbatch.dashboards.transcript import iter_transcripts, load_transcript
from agentbatch.dashboards.transcript_view import FOLD_CHARS, to_html, to_text
from agentbatch.db.store import Store
from agentbatch.flows.cli import main


def _ids(store: Store, batch_id: int) -> list[int]:
    return [s.id for s in store.samples(batch_id)]


def test_runner_transcript(store):
    bid = write_runner(store)
    ok_id, bad_id = _ids(store, bid)
    t = load_transcript(store, bid, ok_id)
    assert (t.task_id, t.group, t.status, t.score) == ("weather", "tools", "completed", 1.0)
    assert t.result == {"score": 1.0, "valid": True, "checker": "exact"}
    assert [(s.index, s.attempt, s.kind, s.status) for s in t.steps] == [
        (0, 1, "inference", "completed"), (1, 1, "environment", "failed"), (1, 2, "environment", "completed"),
        (2, 1, "inference", "completed")]
    first, failed, retried, last = t.steps
    assert [(m.role, m.content) for m in first.inputs] == [("system", "You are a weather agent."),
                                                          ("user", "Weather in Paris?")]
    assert [(c.name, c.arguments) for c in first.outputs[0].tool_calls] == [("get_weather", '{"city": "Paris"}')]
    assert failed.error == "EnvironmentFailure: sandbox timed out" and failed.outputs == []
    assert retried.outputs[0].role == "tool" and retried.outputs[0].content.startswith("sunny, 21 C row")
    assert (retried.queued_s, retried.running_s, retried.worker) == (0.5, 1.0, "slot-0")
    assert (last.prompt_tokens, last.cached_tokens, last.output_tokens) == (6200, 120, 8)
    assert last.outputs[0].content == "It is sunny in Paris." and last.inputs == []
    assert t.retries == 1 and t.latency_s == 8.0
    bad = load_transcript(store, bid, bad_id)
    assert bad.error == "ScoringError: checker crashed"
    assert [c.name for c in bad.tool_calls()] == ["rm_rf"] and bad.observations()[0].content == HOSTILE


def test_gateway_transcript_shows_each_message_once(store):
    """The second request repeats the answer and the tool result: only the new user turn is shown."""
    bid = write_batch(store, gateway_samples())
    t = load_transcript(store, bid, _ids(store, bid)[0])
    first, tool, second = t.steps
    assert [m.role for m in first.inputs] == ["user"] and first.outputs[0].tool_calls[0].name == "add"
    assert (tool.call.name, tool.call.arguments) == ("add", '{"a": 40, "b": 2}')
    assert [m.content for m in tool.outputs] == ["42"]
    assert [(m.role, m.content) for m in second.inputs] == [("user", "Thanks. Twice that?")]
    assert second.outputs[0].content == "84"
    text = to_text(t)
    assert text.count("[tool] 42") == 1  # the tool result once, though the harness sent it back
    assert "-> call add" in text


def test_text_folds_and_escapes(store):
    bid = write_runner(store)
    ok_id, bad_id = _ids(store, bid)
    short = to_text(load_transcript(store, bid, ok_id))
    assert f"({len('sunny, 21 C ' + LONG) - FOLD_CHARS} more characters; --full shows them)" in short
    assert LONG not in short and LONG in to_text(load_transcript(store, bid, ok_id), full=True)
    bad = to_text(load_transcript(store, bid, bad_id))
    assert "\x1b" not in bad and "\\x1b[31mred" in bad  # a terminal escape is shown, not obeyed
    page = to_html(load_transcript(store, bid, bad_id))
    assert "<script>document" not in page and "&lt;script&gt;" in page
    assert "script-src 'none'" in page


def test_show_command(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'a.sqlite'}"
    store = Store(url)
    bid = write_runner(store)
    ok_id, bad_id = _ids(store, bid)
    store.close()
    assert main(["show", str(bid), str(ok_id), "--db", url]) == 0
    out = capsys.readouterr().out
    assert "task weather [tools]: completed, score 1" in out and "1 failed attempt(s)" in out
    assert "-> call get_weather({\"city\": \"Paris\"})" in out
    assert "step 1 environment; attempt 1; failed; worker slot-0; queued 0.500 s, running 1.000 s" in out
    assert "tokens 6200 in (120 cached), 8 out" in out
    assert main(["show", str(bid), "1", "--index", "--db", url]) == 0
    assert "task cleanup" in capsys.readouterr().out
    assert main(["show", str(bid), "999", "--db", url]) == 2
    assert "no sample with id 999 in batch" in capsys.readouterr().err
    assert main(["show", "77", "1", "--db", url]) == 2


def test_read_only_commands_exit_quietly_on_a_closed_pipe(tmp_path):
    """`agentbatch show ... --full | head -1`: more output than a pipe holds, the reader gone."""
    url = f"sqlite:///{tmp_path / 'a.sqlite'}"
    store = Store(url)
    samples = [dict(task_id="big", admitted=1000.0, finished=1002.0, status="completed", score=1.0, steps=[
        dict(index=0, kind="environment", enq=1000.0, start=1000.0, fin=1001.0,
             response={"messages": [{"role": "tool", "content": "x" * 2_000_000}]})])]
    bid = write_batch(store, samples)
    sid = _ids(store, bid)[0]
    store.close()
    for args in (["show", str(bid), str(sid), "--full"], ["status", str(bid)]):
        proc = subprocess.Popen([sys.executable, "-m", "agentbatch.flows.cli", *args, "--db", url],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.read(10)
        proc.stdout.close()  # the reader goes away, as `head` does
        err = proc.stderr.read().decode() if proc.stderr else ""
        code = proc.wait(timeout=120)
        assert "Traceback" not in err and "BrokenPipeError" not in err, err
        assert code in (0, 141)  # 141: stopped by the closed pipe (status may finish first)
    assert code == 0 or args[0] == "status"


@pytest.mark.usefixtures("prefect_api")
def test_real_batch_transcripts_match_its_steps(sqlite_url):
    """A real BFCL batch (scripted engine, real backends): every tool call the model made is followed
    by an observation, and each transcript holds as many steps as the sample recorded."""
    from agentbatch.flows.batch import create_batch, run_flow
    from agentbatch.flows.config import BatchConfig

    config = BatchConfig.model_validate({
        "name": "transcripts", "workload": {"kind": "bfcl", "params": {"limit": 3, "seed": 3}},
        "engine": {"kind": "scripted", "params": {"workers": 1, "timing": {"kind": "token", "scale": 0.1}}},
        "scheduling": {"max_active_samples": 3, "env_slots": 2, "per_worker_inflight": 2}})
    store = Store(sqlite_url)
    bid = create_batch(config, store)
    run_flow(store, bid, show_progress=False)
    transcripts = list(iter_transcripts(store, bid, chunk=2))
    samples = store.samples(bid)
    assert [t.sample_id for t in transcripts] == [s.id for s in samples]
    for t, s in zip(transcripts, samples, strict=True):
        assert len(t.steps) == s.steps_done and t.score == s.score == 1.0
        assert t.steps[0].inputs[-1].role == "user" and t.steps[0].inputs[-1].content
        for i, step in enumerate(t.steps):
            calls = [c for m in step.outputs for c in m.tool_calls]
            if calls:  # the environment step after it answers each call with an observation
                after = t.steps[i + 1]
                assert after.kind == "environment"
                assert len([m for m in after.outputs if m.role == "tool"]) == len(calls)
        assert any(c.arguments.startswith("{") for c in t.tool_calls())
    store.close()


def test_real_gateway_batch_transcripts(sqlite_url):
    """Two BFCL samples driven by a plain openai-SDK harness through the inference gateway (two
    simulated workers): each transcript shows the user turns, the tool calls with their arguments and
    the tool results the harness sent back, each once, and the answers."""
    import asyncio
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))
    from gateway_helpers import (
        MODEL,
        BfclHarnessEnv,
        gateway_config,
        ground_truth_policy,
        serve_gateway,
        sim_workers,
    )
    from openai import AsyncOpenAI
    from plain_openai_harness import run_sample

    from agentbatch.environments.bfcl import BfclWorkload

    workload = BfclWorkload(categories=["multi_turn_base"], limit=2, seed=7)
    task_ids = [t.task_id for t in workload.tasks()]

    async def drive(base_url: str) -> None:
        client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=600)
        try:
            await asyncio.gather(*(run_sample(client, MODEL, t, BfclHarnessEnv(t), ground_truth_policy(workload, t))
                                   for t in task_ids))
        finally:
            await client.close()

    store = Store(sqlite_url)
    with sim_workers(2, time_scale=0.2) as endpoints:
        config = gateway_config(endpoints, max_active_samples=2, per_worker_inflight=2)
        with serve_gateway(store, config, endpoints) as gw:
            asyncio.run(drive(gw.base_url + "/v1"))
            bid = gw.batch_id
    for t in iter_transcripts(store, bid):
        assert t.task_id in task_ids and all(s.kind == "inference" for s in t.steps)
        shown = [m for s in t.steps for m in s.inputs + s.outputs]
        assert shown[0].role == "user" and shown[0].content
        calls = [c for m in shown for c in m.tool_calls]
        assert calls and all(c.arguments.startswith("{") for c in calls)
        for before, after in zip(t.steps, t.steps[1:], strict=False):  # each call's result, once, in the next request
            made = sum(len(m.tool_calls) for m in before.outputs)
            assert sum(m.role == "tool" for m in after.inputs) == made
        assert sum(m.role == "assistant" for m in shown) == len(t.steps)  # each answer once
    store.close()
