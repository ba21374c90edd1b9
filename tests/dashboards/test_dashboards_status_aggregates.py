"""`status` from SQL aggregates: the same figures as computed from every row with pandas, on SQLite
and PostgreSQL, and a status process that never imports pandas or Prefect.

The reference below is the frame-based computation `status` used before (every sample and step
loaded with `frames.load_batch`), kept here to hold the aggregates to it on a mixed batch: samples in
every state, failed, abandoned and running attempts, task ids with and without earlier batches,
groups with unscored and NaN scores, and a sample stopped for a check.
"""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from dashboards_batches import T0, write_batch

from agentbatch.dashboards.checks import stopped_in_flight
from agentbatch.dashboards.eta import estimate_eta
from agentbatch.dashboards.frames import BatchData, load_batch
from agentbatch.dashboards.groups import GroupScore, group_scores, tallied_group_scores
from agentbatch.db.models import DONE_SAMPLES
from agentbatch.db.store import GroupTally, Store
from agentbatch.protocols.environment import IN_FLIGHT_STOPPED

NOW = T0 + 100.0


def _chain(rng: random.Random, n: int, start: float, last: str | None = None) -> list[dict[str, Any]]:
    """n completed steps (some after a failed or abandoned attempt), then optionally one `last` attempt."""
    steps: list[dict[str, Any]] = []
    t = start
    for i in range(n):
        kind = "inference" if i % 2 == 0 else "environment"
        if rng.random() < 0.2:
            steps.append(dict(index=i, kind=kind, enq=t, start=t, fin=t + 0.5, attempt=1,
                              status=rng.choice(["failed", "abandoned"])))
            t += 0.5
        each = rng.uniform(0.5, 3.0)
        steps.append(dict(index=i, kind=kind, enq=t, start=t, fin=t + each, attempt=2 if steps and
                          steps[-1]["index"] == i else 1))
        t += each
    if last:
        steps.append(dict(index=n, kind="inference", enq=t, start=t, fin=None if last == "running" else t + 1,
                          status=last))
    return steps


def mixed_samples(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(40):
        status = rng.choice(["completed", "completed", "failed", "running", "running", "pending"])
        admitted = None if status == "pending" else T0 + rng.uniform(0, 20)
        n = 0 if status == "pending" else rng.randint(0 if status == "running" else 1, 8)
        steps = [] if admitted is None else _chain(rng, n, admitted, "running" if status == "running" and
                                                   rng.random() < 0.5 else None)
        done = status in DONE_SAMPLES
        score = rng.choice([1.0, 0.0, 0.5, None, math.nan]) if status == "completed" else None
        out.append(dict(task_id=f"t{rng.randint(0, 14)}", status=status, admitted=admitted, steps=steps,
                        finished=(steps[-1]["fin"] if steps else admitted) if done else None, score=score,
                        group=rng.choice(["math", "code", None]),
                        error=f"{IN_FLIGHT_STOPPED}step 3 of task t{i} may have executed" if i == 7 else None))
    return out


def reference(store: Store, batch_id: int, earlier_id: int, now: float) -> dict[str, Any]:
    """The frame-based figures: every sample and step of the batch loaded, then pandas (the earlier
    batch as the only other one)."""
    data: BatchData = load_batch(store, batch_id)
    sm, st = data.samples, data.steps
    done = sm["status"].isin(DONE_SAMPLES)
    completed_steps = st[st["status"] == "completed"]
    t0 = sm["admitted_at"].min()
    left = sm[~done]
    prior = pd.DataFrame(
        [(s.task_id, s.steps_done) for s in store.samples(earlier_id, ["completed"])], columns=["task_id", "n"])
    hist = prior.groupby("task_id")["n"].mean()
    completed = sm[sm["status"] == "completed"]
    expected = left["task_id"].map(hist).astype("float64").fillna(float(completed["steps_done"].mean()))
    remaining = (expected - left["steps_done"]).clip(lower=1.0)
    last_fin = completed_steps.groupby("sample_id")["finished_at"].max()
    per = sm.set_index("id").join(last_fin.rename("last_fin"), how="inner")
    per = per[per["steps_done"] > 0]
    per_step = ((per["last_fin"] - per["admitted_at"]) / per["steps_done"]).clip(lower=0)
    return dict(
        total=len(sm), done=int(done.sum()), counts={str(k): int(v) for k, v in sm["status"].value_counts().items()},
        steps_done=len(completed_steps), steps_retried=int(st["status"].isin(["failed", "abandoned"]).sum()),
        steps_running=int((st["status"] == "running").sum()), elapsed_s=max(0.0, now - float(t0)),
        tasks_with_history=int(left["task_id"].isin(hist.index).sum()),
        remaining_steps=float(remaining.sum()), longest=float(remaining.max()),
        step_s_per_sample=float(per_step.mean()),
        groups=group_scores(sm.itertuples()), stopped=stopped_in_flight(sm.itertuples()),
    )


def _rounded(groups: dict[str, GroupScore]) -> list[tuple[str, int, int, float | None]]:
    return [(g.group, g.samples, g.scored, None if g.mean is None else round(g.mean, 9)) for g in groups.values()]


def test_aggregates_match_the_frames(store: Store) -> None:
    earlier = [dict(task_id=f"t{k}", status="completed", admitted=T0 - 500, finished=T0 - 400, score=1.0,
                    steps=_chain(random.Random(k), 2 + k % 5, T0 - 500)) for k in range(0, 15, 2)]
    earlier += [dict(task_id="t0", status="completed", admitted=T0 - 300, finished=T0 - 200, steps=_chain(
        random.Random(99), 7, T0 - 300)), dict(task_id="t4", status="failed", admitted=T0 - 300, steps=[])]
    earlier_id = write_batch(store, earlier, name="earlier")
    bid = write_batch(store, mixed_samples(seed=3), status="running", heartbeat_at=NOW - 1)
    ref = reference(store, bid, earlier_id, NOW)
    eta = estimate_eta(store, bid, now=NOW)

    got = {k: getattr(eta, k) for k in ("total", "done", "counts", "steps_done", "steps_retried", "steps_running",
                                        "tasks_with_history")}
    assert got == {k: ref[k] for k in got}
    assert 0 < eta.tasks_with_history < eta.total - eta.done  # both sources of chain lengths are used
    assert eta.elapsed_s == pytest.approx(ref["elapsed_s"])
    assert eta.remaining_steps == pytest.approx(ref["remaining_steps"])
    assert eta.step_s_per_sample == pytest.approx(ref["step_s_per_sample"])
    rate = ref["steps_done"] / ref["elapsed_s"]
    assert eta.remaining_s == pytest.approx(max(ref["remaining_steps"] / rate, ref["longest"] * ref["step_s_per_sample"]))
    assert _rounded(tallied_group_scores(store.group_tallies(bid))) == _rounded(ref["groups"])
    assert set(ref["groups"]) == {"math", "code"}
    assert stopped_in_flight(store.samples_with_error_prefix(bid, IN_FLIGHT_STOPPED)) == ref["stopped"]
    assert len(ref["stopped"]) == 1


def test_aggregates_of_a_finished_batch_and_of_one_with_no_history(store: Store) -> None:
    samples = [x for x in mixed_samples(seed=8) if x["status"] != "pending"]
    for x in samples:
        if x["status"] == "running":
            x.update(status="failed", finished=x["admitted"] + 1.0)
            x["steps"] = [s for s in x["steps"] if s.get("fin") is not None]
    done = write_batch(store, samples)
    eta = estimate_eta(store, done, now=NOW)
    ref = load_batch(store, done)
    sm = ref.samples
    assert (eta.done, eta.total, eta.remaining_s, eta.basis) == (len(sm), len(sm), 0.0, "finished")
    assert eta.elapsed_s == pytest.approx(float(sm["finished_at"].max() - sm["admitted_at"].min()))
    # Nothing finished, nothing earlier: every unfinished sample's chain is a lower bound (steps so far + 1).
    fresh = write_batch(store, [dict(task_id=f"new{i}", status="running", admitted=T0, finished=None,
                                     steps=_chain(random.Random(i), i, T0)) for i in range(4)], status="running",
                        heartbeat_at=NOW)
    eta = estimate_eta(store, fresh, now=NOW)
    assert eta.remaining_steps == pytest.approx(4.0) and "lower bound for 4 samples" in eta.basis
    assert eta.step_s_per_sample is not None and eta.step_rate == pytest.approx(6 / 100)


def test_group_tallies_leave_nan_scores_unscored(store: Store) -> None:
    bid = write_batch(store, [dict(task_id="a", status="completed", admitted=T0, finished=T0 + 1, score=s, group="g")
                              for s in (1.0, math.nan, None, 0.0)])
    # PostgreSQL keeps the NaN, SQLite stores it as NULL: unscored either way, as `group_scores` has it.
    assert store.group_tallies(bid) == {"g": GroupTally(4, 2, 0.5)}


def test_status_imports_neither_pandas_nor_prefect(sqlite_url: str) -> None:
    """`agentbatch status` in a process of its own: its answer, and the heavy modules it never loads
    (NumPy and PyArrow come with the recorded workload's module, which status finds but never imports;
    pydantic with the plugins' parameter models)."""
    store = Store(sqlite_url)
    config = {"workload": {"kind": "recorded"}, "engine": {"kind": "replay"}}
    bid = write_batch(store, mixed_samples(seed=5), config=config, status="running", heartbeat_at=time.time())
    store.close()
    probe = ("import sys; from agentbatch.flows.cli import main; code = main(sys.argv[1:]); "
             "print('LOADED', sorted(m for m in ('pandas', 'prefect', 'numpy', 'pyarrow', 'pydantic', "
             "'agentbatch.environments.recorded') "
             "if m in sys.modules)); sys.exit(code)")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", probe, "status", str(bid), "--db", sqlite_url],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert f"batch {bid} (known): running" in done.stdout and "ETA" in done.stdout
    assert "CHECK sample" in done.stdout and "score by group" in done.stdout and "workload recorded" in done.stdout
    assert "LOADED []" in done.stdout, done.stdout


def test_plugins_line_without_importing_the_targets() -> None:
    from agentbatch.flows.stored_plugins import plugins_line

    stored = {"workload": {"kind": "recorded"}, "engine": {"kind": "agentbatch.engines.replay:build_replay_workers"}}
    assert plugins_line(stored, import_targets=False) == plugins_line(stored)
    gone = plugins_line({"workload": {"kind": "uninstalled_pkg.mod:Bench"}, "engine": {"kind": "no-such-engine"}},
                        import_targets=False)
    assert "workload uninstalled_pkg.mod:Bench -> NOT RESOLVABLE here" in gone
    assert "engine no-such-engine -> NOT RESOLVABLE here (unknown engine 'no-such-engine';" in gone
