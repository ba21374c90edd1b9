"""The Python API: `agentbatch.run` with objects, a result with per-sample and per-group figures,
`resume`, the same batch as a subflow of a user's Prefect flow, and bad input refused up front."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect import flow

import agentbatch
from agentbatch.db.store import Store

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_api", "toolbench_installed")]


def test_run_with_objects_then_resume(tmp_path: Path) -> None:
    from toolbench.policy import FewestStepsFirst
    from toolbench.workload import ToolBench

    db = f"sqlite:///{tmp_path / 'api.sqlite'}"
    result = agentbatch.run(name="api", workload=ToolBench, workload_params={"tasks_per_suite": 2},
                            engine="scripted", scheduling={"priority": FewestStepsFirst}, db=db)
    assert result.status == "completed" and result.completed == 4 and result.failed == 0
    assert result.score_mean == 1.0 and result.group_scores == {"arith": 1.0, "notes": 1.0}
    assert {s.group for s in result.samples} == {"arith", "notes"} and all(s.steps > 0 for s in result.samples)
    assert result.makespan_s and result.lower_bound_s and result.makespan_s >= result.lower_bound_s
    stored = Store(db).get_batch(result.batch_id).config
    assert stored["workload"]["kind"] == "toolbench.workload:ToolBench"
    assert stored["scheduling"]["priority"]["name"] == "toolbench.policy:FewestStepsFirst"

    again = agentbatch.resume(result.batch_id, db=db)  # nothing left to do: same results
    assert [(s.task_id, s.score, s.steps) for s in again.samples] == \
        [(s.task_id, s.score, s.steps) for s in result.samples]


def test_run_as_a_subflow_of_a_users_flow(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'sub.sqlite'}"

    @flow(name="nightly-eval")
    def nightly() -> float | None:
        return agentbatch.run({"name": "sub", "workload": {"kind": "toolbench", "params": {"tasks_per_suite": 1}}},
                              db=db).score_mean

    assert nightly() == 1.0


def test_bad_config_raises_before_anything_is_written(tmp_path: Path) -> None:
    path = tmp_path / "never.sqlite"
    with pytest.raises(agentbatch.ConfigError) as err:
        agentbatch.run(workload="toolbench", workload_params={"tasks_per_suite": True}, db=f"sqlite:///{path}")
    assert [i.field for i in err.value.issues] == ["workload.params.tasks_per_suite"]
    assert not path.exists()
    with pytest.raises(TypeError, match="module-level"):
        agentbatch.run(workload=lambda: None, db=f"sqlite:///{path}")
