"""Scheduled-eval runs (the deployed flow, run in-process against a real Prefect server): each run's
diff against the suite's previous one, as `diff` prints it and as the Prefect artifact flags it;
`history` lists the runs; the HTML report has the history section."""

from __future__ import annotations

import asyncio
import json

import pytest
from history_helpers import TASKS, WRONG, cli, config, wrong_engine

from agentbatch.db import history
from agentbatch.db.store import Store
from agentbatch.flows.deployments import FLOW_NAME, scheduled_eval

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api")]


async def read_artifact(key: str) -> str:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    async with get_client() as client:
        found = await client.read_latest_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert found, f"no artifact {key}"
    return str(found[0].data)


async def flow_run_name(flow_run_id: str) -> tuple[str, str]:
    from prefect import get_client

    async with get_client() as client:
        run = await client.read_flow_run(flow_run_id)
        flow = await client.read_flow(run.flow_id)
    return flow.name, run.name


def test_runs_of_a_suite_diff_and_flag_regressions(tmp_path, capsys, monkeypatch) -> None:
    db = f"sqlite:///{tmp_path / 'evals.sqlite'}"
    first = asyncio.run(scheduled_eval(config=config(), db_url=db, tag="ckpt-1"))
    second = asyncio.run(scheduled_eval(config=config(), db_url=db, tag="ckpt-2"))
    third = asyncio.run(scheduled_eval(config=config(wrong_engine(monkeypatch)), db_url=db, tag="ckpt-3",
                                       report_dir=str(tmp_path / "reports")))
    assert [r["completed"] for r in (first, second, third)] == [4, 4, 4]
    assert (first["previous_batch_id"], second["previous_batch_id"], third["previous_batch_id"]) == \
        (None, first["batch_id"], second["batch_id"])
    assert second["regressions"] == 0 and third["regressions"] == 2
    assert sum(f.startswith("task ") for f in third["flags"]) == 2

    store = Store(db)
    b1, b2, b3 = first["batch_id"], second["batch_id"], third["batch_id"]
    key = history.suite_row(store, b1).suite_key
    assert [r.batch_id for r in history.suite_runs(store, key)] == [b1, b2, b3]
    assert history.priors_used(store, b2).source == "suite"
    batch = store.get_batch(b3)
    assert asyncio.run(flow_run_name(batch.flow_run_id)) == (FLOW_NAME, "nightly-ckpt-3")
    store.close()

    # The artifact of the last run (no deployment: keyed by suite) flags the two wrong tasks.
    markdown = asyncio.run(read_artifact(f"agentbatch-diff-suite-{key}"))
    assert "**2 regressed task(s)**" in markdown
    assert all(t.replace("_", "\\_") in markdown for t in WRONG)

    assert cli("diff", str(b1), str(b2), "--db", db) == 0
    out = capsys.readouterr().out
    assert "regressed  0" in out and "regressions: 0 task(s)" in out
    assert cli("diff", str(b3), "--db", db, "--json", "--fail-on-regression") == 1  # against b2
    d = json.loads(capsys.readouterr().out)
    assert d["before"]["batch_id"] == b2 and d["regressions"] == 2
    assert sorted(c["task_id"] for c in d["regressed"]) == sorted(WRONG) and d["fixed"] == []
    groups = {g["group"]: g for g in d["groups"]}
    assert groups["multi_turn_miss_param"]["delta"] == -1.0 and groups["multi_turn_miss_param"]["regressed"]
    assert groups["multi_turn_base"]["delta"] == 0.0 and not groups["multi_turn_base"]["regressed"]
    assert groups["(overall)"]["after"] == 0.5
    assert cli("diff", str(b3), str(b2), "--db", db) == 0  # the other way round: two fixed
    assert "fixed      2" in capsys.readouterr().out

    assert cli("history", "nightly", "--db", db) == 0
    out = capsys.readouterr().out
    assert f"suite {key}: 3 run(s) of {len(TASKS)} task(s)" in out
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0] in {str(b1), str(b2), str(b3)}]
    assert [r[3] for r in rows] == ["ckpt-1", "ckpt-2", "ckpt-3"]
    assert rows[2][-1] == "x2" and rows[0][-1] == "-"  # priors: suite x2 / none

    page = (tmp_path / "reports" / f"batch-{b3}" / "index.html").read_text()
    assert f"History (suite {key})" in page and 'id="chart-history-score"' in page and "ckpt-2" in page
