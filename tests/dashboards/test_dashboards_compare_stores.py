"""Comparisons across stores (`--compare URL#ID`, `PATH#ID`), score differences counted per batch
pair, and a stopped-and-resumed batch compared on its active time."""

from __future__ import annotations

import re

import pytest
from dashboards_batches import KNOWN_CONFIG, T0, known_samples, write_batch

from agentbatch.dashboards.analytics import BatchAnalysis
from agentbatch.dashboards.compare import check_scores, compare
from agentbatch.dashboards.frames import load_batch
from agentbatch.db.store import Store
from agentbatch.flows.cli import main


def _store(tmp_path, name: str, *scores: tuple[float, ...]) -> tuple[str, list[int]]:
    url = f"sqlite:///{tmp_path / name}"
    store = Store(url)
    ids = [write_batch(store, known_samples(s), config=KNOWN_CONFIG, workers=("w0", "w1")) for s in scores]
    store.close()
    return url, ids


def test_compare_batches_of_two_stores(tmp_path, capsys):
    a_url, (a,) = _store(tmp_path, "a.sqlite", (1.0, 0.0, 1.0, 1.0))
    b_url, (b1, b2) = _store(tmp_path, "b.sqlite", (1.0, 1.0, 1.0, 1.0), (1.0, 0.0, 1.0, 1.0))
    assert (a, b1) == (1, 1)  # the same id in both stores: told apart by the store
    out_dir = tmp_path / "r"
    code = main(["report", str(a), "--db", a_url, "--out", str(out_dir),
                 "--compare", f"{tmp_path / 'b.sqlite'}#{b1}", f"{b_url}#{b2}"])
    out = capsys.readouterr().out
    assert code == 0
    other1, other2 = f"batch 1@{tmp_path / 'b.sqlite'}", f"batch 2@{b_url}"
    assert "comparison against batch 1 (known)" in out
    assert f"  {other1} (known): makespan 14.0 s = 1.000 x batch 1" in out
    # three batches: every pair, with the count and the task ids that differ
    assert f"    batch 1 vs {other1}: 1 of 4 task ids differ (t1)" in out
    assert f"    batch 1 vs {other2}: agree on 4 task ids" in out
    assert f"    {other1} vs {other2}: 1 of 4 task ids differ (t1)" in out
    page = (out_dir / "index.html").read_text()
    assert re.search(r'id="score-verdict">Scores DIFFER', page)
    # each batch's transcripts, in files of their own
    pages = sorted(p.name for p in (out_dir / "samples").iterdir())
    assert len(pages) == 12 and len({p.rsplit("-s", 1)[0] for p in pages}) == 3


def test_compare_value_errors(tmp_path, capsys):
    a_url, (a,) = _store(tmp_path, "a.sqlite", (1.0, 0.0, 1.0, 1.0))
    _store(tmp_path, "two.sqlite", (1.0,) * 4, (1.0,) * 4)
    _store(tmp_path, "one.sqlite", (1.0,) * 4)
    base = ["report", str(a), "--db", a_url, "--out", str(tmp_path / "r")]
    assert main([*base, "--compare", str(tmp_path / "one.sqlite")]) == 0  # a store of one batch: that one
    capsys.readouterr()
    for value, message in ((str(tmp_path / "two.sqlite"), "holds batches 1, 2: name one as"),
                           (str(tmp_path / "none.sqlite"), "no store file"),
                           (f"{tmp_path / 'one.sqlite'}#x", "expected ID, URL#ID or PATH#ID"),
                           (f"{tmp_path / 'one.sqlite'}#9", "no batch with id 9")):
        assert main([*base, "--compare", value]) == 2, value
        assert message in capsys.readouterr().err, value


def test_many_differing_tasks_are_counted_not_cut(store):
    samples = [dict(task_id=f"task-{i:03d}", admitted=T0, finished=T0 + 1, status="completed", score=1.0,
                    steps=[]) for i in range(97)]
    a = write_batch(store, samples)
    for x in samples[:43]:
        x["score"] = 0.0
    b = write_batch(store, samples)
    check = check_scores([BatchAnalysis(load_batch(store, x)) for x in (a, b)])
    (pair,) = check.pairs
    assert len(pair.differ) == 43 and pair.compared == 97
    assert pair.to_text() == (f"batch {a} vs batch {b}: 43 of 97 task ids differ (task-000, task-001, task-002, "
                              "task-003, task-004, task-005, task-006, task-007, task-008, task-009 and 33 more)")


def _resumable(gap: float) -> list[dict]:
    """Two samples; the process dies at 3.5 s and the batch resumes `gap` s later."""
    def st(index, kind, enq, start, fin):
        return dict(index=index, kind=kind, enq=T0 + enq, start=T0 + start, fin=T0 + fin, worker="w0")

    return [
        dict(task_id="a", admitted=T0, finished=T0 + 5 + gap, status="completed", score=1.0, steps=[
            st(0, "inference", 0, 0, 2), st(1, "environment", 2, 2, 3), st(2, "inference", 3.5 + gap, 3.5 + gap, 5 + gap)]),
        dict(task_id="b", admitted=T0, finished=T0 + 6 + gap, status="completed", score=1.0, steps=[
            st(0, "inference", 0, 0, 1), st(1, "environment", 1, 1, 3.5), st(2, "inference", 4 + gap, 4 + gap, 6 + gap)]),
    ]


def test_resumed_batch_dead_time_apart(store):
    """Activity ends at 3.5 s and starts again at 103.5 s: 100 s dead. Sample a waited 3 -> 103.5
    (100.5 s, 0.5 s of it orchestration), b 3.5 -> 104 (100.5 s, 0.5 s): 1 s of orchestration, not 201 s."""
    cfg = {"scheduling": {"env_slots": 2, "per_worker_inflight": 2}}
    resumed = BatchAnalysis(load_batch(store, write_batch(store, _resumable(100.0), config=cfg)))
    plain = BatchAnalysis(load_batch(store, write_batch(store, _resumable(0.0), config=cfg)))
    assert resumed.dead_gaps == [(T0 + 3.5, T0 + 103.5)]
    assert resumed.dead_s == pytest.approx(100.0) and resumed.resumed
    assert resumed.makespan_s == pytest.approx(106.0) and resumed.active_s == pytest.approx(6.0)
    assert resumed.phases["orchestration"] == pytest.approx(1.0)
    assert resumed.per_sample["dead"].sum() == pytest.approx(200.0)
    assert plain.dead_s == 0.0 and not plain.resumed and plain.phases["orchestration"] == pytest.approx(1.0)
    text = compare([plain, resumed]).to_text()
    assert (f"batch {resumed.data.batch_id} (known): makespan 106.0 s (resumed: 100.0 s dead), active 6.0 s = "
            f"1.000 x batch {plain.data.batch_id}'s active time") in text
    assert "resumed       stopped and resumed: 100.0 s dead" in resumed_summary_text(resumed)


def resumed_summary_text(a: BatchAnalysis) -> str:
    from agentbatch.dashboards.summary import summary_from_analysis

    return summary_from_analysis(a).to_text()


def test_a_long_retry_backoff_is_not_dead_time(store):
    """A failed attempt waiting 30 s for its retry keeps the batch busy."""
    steps = [dict(index=0, kind="inference", enq=T0, start=T0, fin=T0 + 1, status="failed", worker="w0"),
             dict(index=0, kind="inference", enq=T0 + 31, start=T0 + 31, fin=T0 + 32, attempt=2, worker="w0")]
    bid = write_batch(store, [dict(task_id="r", admitted=T0, finished=T0 + 32, status="completed", score=1.0,
                                   steps=steps)])
    a = BatchAnalysis(load_batch(store, bid))
    assert a.dead_gaps == [] and not a.resumed and a.phases["retries"] == pytest.approx(1.0)
