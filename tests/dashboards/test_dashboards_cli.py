"""`agentbatch report` and `agentbatch status` through the real CLI entry point."""

from __future__ import annotations

from dashboards_batches import KNOWN_CONFIG, known_samples, write_batch

from agentbatch.db.store import Store
from agentbatch.flows.cli import main


def test_report_and_status_commands(sqlite_url, tmp_path, capsys, monkeypatch):
    store = Store(sqlite_url)
    a = write_batch(store, known_samples(), config=KNOWN_CONFIG, workers=("w0", "w1"))
    b = write_batch(store, known_samples(shift=100.0), config=KNOWN_CONFIG, workers=("w0", "w1"))
    store.close()
    out = tmp_path / "rep"
    assert main(["report", str(a), "--compare", str(b), "--out", str(out), "--db", sqlite_url]) == 0
    text = capsys.readouterr().out
    assert "makespan      14.0 s" in text and "ratio 1.40" in text
    assert "scores agree on 4 task ids" in text
    assert f"report: {(out / 'index.html').resolve()}" in text
    assert (out / "index.html").is_file() and (out / "gantt.png").is_file()

    # Default output folder: ./reports/batch-<id>/
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(a), "--db", sqlite_url]) == 0
    assert (tmp_path / "reports" / f"batch-{a}" / "index.html").is_file()

    assert main(["status", str(a), "--db", sqlite_url]) == 0
    text = capsys.readouterr().out
    assert "4/4 done" in text and "ETA       done" in text


def test_unknown_batch_exit_2(sqlite_url, capsys):
    Store(sqlite_url).close()
    assert main(["report", "77", "--db", sqlite_url]) == 2
    assert "no batch with id 77" in capsys.readouterr().err
    assert main(["status", "77", "--db", sqlite_url]) == 2
    assert "no batch with id 77" in capsys.readouterr().err
