"""Findings 9 and 10: side effects never done twice silently; one flaky server does not fail the batch.

- An environment with external state (`restore_mode: external`) is reattached on resume, never
  re-executed: the ledger's refund happens once (replay re-ran it: refunds doubled).
- Tools that take an `idempotency_key` get one per (sample, step, call): a retried step is a no-op
  on the server; the key is not shown to the model.
- A step of such an environment cut short by a crash is flagged "may have executed" on resume and
  handled by the declared policy (retry, or fail the sample).
- A shared MCP server that dies is restarted alone: the healthy server keeps its process and
  connection, and other samples' toolsets pick up the restarted one without losing an attempt.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from agentbatch.dashboards.summary import stopped_in_flight
from agentbatch.db.leases import MAY_HAVE_EXECUTED, count_may_have_executed, flag_in_flight
from agentbatch.db.models import IN_FLIGHT_CHECKED, Sample, Step
from agentbatch.db.store import Store
from agentbatch.environments.mcp_client import EnvironmentFailure
from agentbatch.environments.mcp_env import McpWorkload
from agentbatch.flows.leased import LeaseKeeper
from agentbatch.protocols.environment import IN_FLIGHT_STOPPED, UNSAFE_CALLS, RecordedTurn

HERE = Path(__file__).parent
PROBE = ["-m", "agentbatch.environments.mcp_servers.probe_server"]


def call_msg(*calls: tuple[str, dict]) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, (n, a) in enumerate(calls)]}


def ledger(tmp_path: Path, **params: object) -> McpWorkload:
    server = {"name": "ledger", "command": sys.executable, "args": [str(HERE / "ledger_server.py"), "--state",
                                                                    str(tmp_path / "ledger.json")]}
    return McpWorkload(servers=[server], tasks=[{"id": "t1", "turns": ["cancel r1"]}], per_sample=True,
                       inject={"session": "{sample_key}"}, batch_label="batch-7", **params)


def refunds(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "ledger.json").read_text())["refunds"]


async def _cancel_then_resume(wl: McpWorkload) -> list[dict]:
    task = wl.tasks()[0]
    first = wl.create(task)
    assistant = call_msg(("cancel_reservation", {"reservation": "r1"}))
    try:
        reset = await first.reset(task)
        result = await first.step(assistant)
    finally:
        await first.close()
    second = wl.create(task)  # the resumed process's fresh environment
    try:
        await second.reset(task)
        await second.restore([RecordedTurn(assistant, result.messages)])
    finally:
        await second.close()
    return reset.tools


@pytest.mark.parametrize("mode,expected", [("external", 1), ("replay", 2)])
def test_restore_of_external_state_never_re_executes(tmp_path: Path, mode: str, expected: int) -> None:
    tools = asyncio.run(_cancel_then_resume(ledger(tmp_path, restore_mode=mode)))
    assert refunds(tmp_path) == {"batch-7:t1": {"r1": expected}}  # replay re-runs it: right only in-process
    params = next(t["function"]["parameters"] for t in tools if t["function"]["name"] == "cancel_reservation")
    assert "idempotency_key" not in params["properties"] and "session" not in params["properties"]


def test_retried_step_sends_the_same_idempotency_key(tmp_path: Path) -> None:
    async def main() -> None:
        wl = ledger(tmp_path, restore_mode="external")
        env = wl.create(wl.tasks()[0])
        assistant = call_msg(("cancel_reservation", {"reservation": "r1"}), ("cancel_reservation", {"reservation": "r2"}))
        try:
            await env.reset(env.task)
            # the step ran on the server, but its record was lost (a crash): the re-run sends the same keys
            await env.step(assistant)
            env.history.pop()
            await env.step(assistant)
            await env.step(call_msg(("cancel_reservation", {"reservation": "r1"})))  # a later step: a new key
        finally:
            await env.close()

    asyncio.run(main())
    assert refunds(tmp_path) == {"batch-7:t1": {"r1": 2, "r2": 1}}


def test_in_flight_step_runs_again_only_where_that_is_safe(store: Store) -> None:
    """A step cut short by a crash runs again only when every call it made is safe to repeat (recorded
    when it began); else its sample stops naming the step, the call and the way on, and `retry` holds it
    until that sample is acknowledged."""
    batch_id = store.create_batch("inflight", {}, [("a", {}), ("b", {}), ("c", {})])
    a, b, c = store.samples(batch_id)
    began = {a.id: {"from_step": 2, UNSAFE_CALLS: []}, b.id: {"from_step": 2, UNSAFE_CALLS: ["refund"]}, c.id: None}
    with store.session() as s, s.begin():
        for sample in (a, b, c):
            s.get(Sample, sample.id).in_flight_step = 3
            if began[sample.id] is not None:  # c: its calls are not known (a row from an older agentbatch)
                s.add(Step(batch_id=batch_id, sample_id=sample.id, index=3, kind="environment", attempt=1,
                           enqueued_at=0.0, started_at=0.0, request=began[sample.id]))
    keeper = LeaseKeeper(store, batch_id)
    assert [s.id for s in keeper.settle_in_flight(keeper.claim(), "retry")] == [a.id]
    flagged = [st for st in store.steps(batch_id) if st.error == MAY_HAVE_EXECUTED]
    assert sorted((st.sample_id, st.index, st.status) for st in flagged) == [
        (a.id, 3, "abandoned"), (b.id, 3, "abandoned"), (c.id, 3, "abandoned")]
    assert count_may_have_executed(store, batch_id) == 3
    assert flag_in_flight(store, keeper.leases.tokens) == []  # cleared: flagged once
    rows = {s.id: s for s in store.samples(batch_id)}
    assert rows[b.id].status == rows[c.id].status == "failed"
    error = rows[b.id].error or ""
    assert error.startswith(IN_FLIGHT_STOPPED) and "step 3 of task b" in error and "refund" in error
    assert f"agentbatch retry {batch_id} --in-flight-checked {b.id}" in error
    assert [s["sample"] for s in stopped_in_flight(store.samples(batch_id))] == [b.id, c.id]

    # retry: held until acknowledged, one sample at a time
    assert store.reset_failed(batch_id, hold=IN_FLIGHT_STOPPED) == 0
    assert store.reset_failed(batch_id, hold=IN_FLIGHT_STOPPED, release=[b.id]) == 1
    assert {s.id: s.status for s in store.samples(batch_id)}[c.id] == "failed"

    # policy "fail": even a step that is safe to repeat stops
    with store.session() as s, s.begin():
        s.get(Sample, a.id).in_flight_step = 5
        s.add(Step(batch_id=batch_id, sample_id=a.id, index=5, kind="environment", attempt=1, enqueued_at=0.0,
                   started_at=0.0, request={"from_step": 4, UNSAFE_CALLS: []}))
    left = keeper.settle_in_flight(keeper.claim(), "fail")
    assert a.id not in [s.id for s in left]
    failed = {s.id: s for s in store.samples(batch_id)}[a.id]
    assert failed.status == "failed" and "in-flight policy is 'fail'" in (failed.error or "")
    keeper.leases.release_all()


def test_dead_shared_server_restarts_alone(tmp_path: Path) -> None:
    servers = [{"name": n, "command": sys.executable, "args": PROBE} for n in ("a", "b")]

    async def main() -> dict:
        wl = McpWorkload(servers=servers, tasks=[{"id": "x", "turns": ["go"]}, {"id": "y", "turns": ["go"]}])
        one, two = (wl.create(t) for t in wl.tasks())
        try:
            await one.reset(one.task)
            await two.reset(two.task)
            before = {n: json.loads((await one.step(call_msg((f"{n}__sleep", {"seconds": 0})))).messages[0]["content"])["pid"]
                      for n in ("a", "b")}
            conn_b = one.toolset.route["b__sleep"][0]
            os.kill(before["a"], signal.SIGKILL)
            await asyncio.sleep(0.5)
            with pytest.raises(EnvironmentFailure):
                await one.step(call_msg(("a__sleep", {"seconds": 0})))
            retried = await one.step(call_msg(("a__sleep", {"seconds": 0})))  # the flow's retry
            other = await two.step(call_msg(("a__sleep", {"seconds": 0})))  # another sample: no failure
            b_after = await one.step(call_msg(("b__sleep", {"seconds": 0})))
            return {"before": before, "a_new": json.loads(retried.messages[0]["content"])["pid"],
                    "a_other": json.loads(other.messages[0]["content"])["pid"],
                    "b_after": json.loads(b_after.messages[0]["content"])["pid"],
                    "same_b_connection": one.toolset.route["b__sleep"][0] is conn_b}
        finally:
            await one.close()
            await two.close()
            await wl.aclose()

    out = asyncio.run(main())
    assert out["a_new"] != out["before"]["a"] and out["a_other"] == out["a_new"]
    assert out["b_after"] == out["before"]["b"] and out["same_b_connection"]  # the healthy one untouched


def _killed_during(tmp_path: Path, sqlite_url: str, name: str, arguments: dict, **params: object) -> dict:
    """`run` a one-task ledger batch whose one step calls `name`, killed with -9 once the server applied
    the call (its answer still pending): done on the server, never recorded. Returns the ledger."""
    import subprocess

    import yaml
    from reliability_helpers import cli_env
    from testkit import CLI

    server = {"name": "ledger", "command": sys.executable,
              "args": [str(HERE / "ledger_server.py"), "--state", str(tmp_path / "ledger.json")]}
    task = {"id": "t1", "turns": ["cancel r1"], "ground_truth": [
        {"calls": [{"name": name, "arguments": {**arguments, "seconds": 600}}], "final_text": "Done."}]}
    cfg = {"name": "ledger", "engine": {"kind": "scripted", "params": {"workers": 1}},
           "workload": {"kind": "mcp", "params": {"servers": [server], "tasks": [task], "per_sample": True,
                                                   "restore_mode": "external", "inject": {"session": "{sample_key}"},
                                                   **params}}}
    path = tmp_path / "ledger.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = subprocess.Popen([*CLI, "run", str(path), "--no-progress"], env=cli_env(sqlite_url), start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while not (tmp_path / "ledger.json").exists() and time.time() < deadline:
            assert run.poll() is None, "the run ended before the call"
            time.sleep(0.2)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    return json.loads((tmp_path / "ledger.json").read_text())


def _one(per_session: dict) -> dict:
    """The one session's entry (the session is the batch's `{sample_key}`)."""
    assert len(per_session) == 1, per_session
    return next(iter(per_session.values()))


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_kill_during_external_step_then_resume_refunds_once(tmp_path: Path, sqlite_url: str) -> None:
    """The run is killed while a slow remote refund is in flight (the refund already happened); the
    resume flags the step "may have executed", re-runs it with the same idempotency key, and the
    ledger shows one refund."""
    from testkit import run_cli_here

    assert _one(_killed_during(tmp_path, sqlite_url, "slow_cancel", {"reservation": "r1"})["refunds"]) == {"r1": 1}
    resumed = run_cli_here(["resume", "1", "--no-progress"], sqlite_url)
    assert resumed.returncode in (0, 1), resumed.stdout + resumed.stderr  # 1: no check, score 0 is fine
    assert "may have executed: 1 step(s)" in resumed.stdout, resumed.stdout
    assert _one(refunds(tmp_path)) == {"r1": 1}  # the re-run sent the same key: no second refund
    store = Store(sqlite_url)
    flagged = [st for st in store.steps(1) if st.error == MAY_HAVE_EXECUTED]
    assert len(flagged) == 1 and flagged[0].kind == "environment"
    assert store.samples(1)[0].status == "completed"
    store.close()


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_kill_during_unkeyed_write_stops_the_sample_and_says_so(tmp_path: Path, sqlite_url: str) -> None:
    """A write with no idempotency key and no annotation, applied by the server but not recorded: the
    resume does not apply it again; the sample stops naming the step and the call, `status` and the
    report's summary.json list it, and `retry` holds it until it is acknowledged."""
    from testkit import run_cli_here

    assert _one(_killed_during(tmp_path, sqlite_url, "slow_refund", {"reservation": "r1"})["refunds"]) == {"r1": 1}
    resumed = run_cli_here(["resume", "1", "--no-progress"], sqlite_url)
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    assert _one(refunds(tmp_path)) == {"r1": 1}  # not applied twice (it was, before)
    store = Store(sqlite_url)
    sample = store.samples(1)[0]
    store.close()
    assert sample.status == "failed" and (sample.error or "").startswith(IN_FLIGHT_STOPPED)
    assert "slow_refund" in sample.error and f"agentbatch retry 1 --in-flight-checked {sample.id}" in sample.error

    status = run_cli_here(["status", "1"], sqlite_url)
    assert f"CHECK sample {sample.id}:" in status.stdout and "slow_refund" in status.stdout, status.stdout
    report = run_cli_here(["report", "1", "--out", str(tmp_path / "report")], sqlite_url)
    assert report.returncode == 0, report.stdout + report.stderr
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert [s["sample"] for s in summary[0]["stopped_in_flight"]] == [sample.id]

    retried = run_cli_here(["retry", "1", "--no-progress"], sqlite_url)
    assert "retrying 0 failed sample(s)" in retried.stdout and f"sample(s) {sample.id}" in retried.stdout, retried.stdout
    assert _one(refunds(tmp_path)) == {"r1": 1}
    assert_checked_retry_completes(tmp_path, sqlite_url, sample.id)
    assert _one(refunds(tmp_path)) == {"r1": 2}  # acknowledged: the step ran again, as asked


def assert_checked_retry_completes(tmp_path: Path, sqlite_url: str, sample_id: int) -> None:
    """`retry --in-flight-checked SAMPLE_ID` through the CLI: the step runs again, the sample completes,
    its flagged step is marked checked (not counted as unchecked, not asked about again)."""
    from testkit import run_cli_here

    checked = run_cli_here(["retry", "1", "--in-flight-checked", str(sample_id), "--no-progress"], sqlite_url)
    assert "retrying 1 failed sample(s)" in checked.stdout, checked.stdout + checked.stderr
    assert checked.returncode in (0, 1), checked.stdout + checked.stderr  # 1: no check, score 0 is fine
    store = Store(sqlite_url)
    sample = store.samples(1)[0]
    errors = [st.error for st in store.steps(1) if st.error and st.error.startswith(MAY_HAVE_EXECUTED)]
    store.close()
    assert sample.status == "completed" and sample.error is None, sample.error
    assert errors == [IN_FLIGHT_CHECKED]


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_kill_during_idempotent_annotated_call_runs_it_again(tmp_path: Path, sqlite_url: str) -> None:
    """A tool annotated `idempotentHint` (read from list_tools) is safe to repeat: the resume runs the
    step again and the sample completes."""
    from testkit import run_cli_here

    ledger_state = _killed_during(tmp_path, sqlite_url, "slow_set_status", {"reservation": "r1", "status": "cancelled"})
    assert _one(ledger_state["calls"]) == {"r1": 1}
    resumed = run_cli_here(["resume", "1", "--no-progress"], sqlite_url)
    assert resumed.returncode in (0, 1), resumed.stdout + resumed.stderr
    after = json.loads((tmp_path / "ledger.json").read_text())
    assert _one(after["calls"]) == {"r1": 2} and _one(after["status"]) == {"r1": "cancelled"}
    store = Store(sqlite_url)
    assert store.samples(1)[0].status == "completed"
    store.close()


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_kill_during_unkeyed_write_the_server_reconciles(tmp_path: Path, sqlite_url: str) -> None:
    """The same unkeyed write with the workload's reconcile hook (`reconcile_tool`): on resume the
    server says the refund ran, so the step is recorded with the server's result and not executed
    again; the sample completes with one refund."""
    from testkit import run_cli_here

    killed = _killed_during(tmp_path, sqlite_url, "slow_refund", {"reservation": "r1"},
                            reconcile_tool="agentbatch_reconcile")
    assert _one(killed["refunds"]) == {"r1": 1}
    resumed = run_cli_here(["resume", "1", "--no-progress"], sqlite_url)
    assert resumed.returncode in (0, 1), resumed.stdout + resumed.stderr  # 1: no check, score 0 is fine
    assert _one(refunds(tmp_path)) == {"r1": 1}  # not applied twice
    store = Store(sqlite_url)
    sample = store.samples(1)[0]
    steps = store.steps(1)
    store.close()
    assert sample.status == "completed", sample.error
    step = next(st for st in steps if st.status == "completed" and st.index == 1)
    assert step.request["reconciled"] == "ran"
    assert json.loads(step.response["messages"][0]["content"]) == {"refunded": "r1", "count": 1}


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_kill_during_write_the_server_cannot_reconcile_stops_the_sample(tmp_path: Path, sqlite_url: str) -> None:
    """The hook answers "cannot tell" (a notification the server keeps no trace of): the sample stops as
    without a hook, the answer in its error; once checked, `retry --in-flight-checked` runs the step
    again without asking."""
    from testkit import run_cli_here

    killed = _killed_during(tmp_path, sqlite_url, "slow_notify", {"reservation": "r1"},
                            reconcile_tool="agentbatch_reconcile")
    assert killed["notified"] == 1
    resumed = run_cli_here(["resume", "1", "--no-progress"], sqlite_url)
    assert resumed.returncode == 1, resumed.stdout + resumed.stderr
    store = Store(sqlite_url)
    sample = store.samples(1)[0]
    store.close()
    assert sample.status == "failed" and (sample.error or "").startswith(IN_FLIGHT_STOPPED), sample.error
    assert "slow_notify" in sample.error and "agentbatch_reconcile answered: cannot tell" in sample.error
    assert json.loads((tmp_path / "ledger.json").read_text())["notified"] == 1
    assert_checked_retry_completes(tmp_path, sqlite_url, sample.id)
    assert json.loads((tmp_path / "ledger.json").read_text())["notified"] == 2


def test_ledger_reconcile_answers_ran_and_not_run(tmp_path: Path) -> None:
    """The mcp environment's hook against the ledger: a refund not applied → not_run; applied → ran with
    the server's result, and the environment is then as after the step."""
    async def main() -> tuple[str, str, object, int]:
        wl = ledger(tmp_path, restore_mode="external", reconcile_tool="agentbatch_reconcile")
        assert wl.reconciles
        env = wl.create(wl.tasks()[0])
        assistant = call_msg(("slow_refund", {"reservation": "r1"}))
        try:
            await env.reset(env.task)
            before = await env.reconcile(assistant)
            await env.step(assistant)
            env.history.pop()  # its record lost in a crash
            after = await env.reconcile(assistant)
            assert after.result is not None
            return before.status, after.status, json.loads(after.result.messages[0]["content"]), len(env.history)
        finally:
            await env.close()

    assert asyncio.run(main()) == ("not_run", "ran", {"refunded": "r1", "count": 1}, 1)
