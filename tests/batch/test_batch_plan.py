"""A run builds its workload and its store once, from `agentbatch.run` to the first step, and a
sandbox workload's label is fixed when the batch is planned (the same containers on resume)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import agentbatch
from agentbatch.db import history
from agentbatch.db.store import Store
from agentbatch.environments.bfcl import BfclWorkload
from agentbatch.flows.batch import batch_workload, create_batch, plan_batch
from agentbatch.flows.config import BatchConfig


class CountedBfcl(BfclWorkload):
    """BFCL, counting how often the workload is built."""

    built = 0

    def __init__(self, **params: Any) -> None:
        type(self).built += 1
        super().__init__(**params)


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_a_run_builds_its_workload_and_opens_its_store_once(tmp_path: Path, monkeypatch) -> None:
    opened: list[str] = []
    init = Store.__init__

    def counting_init(self: Store, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        opened.append(self.url)

    monkeypatch.setattr(Store, "__init__", counting_init)
    CountedBfcl.built = 0
    result = agentbatch.run(name="once", workload=CountedBfcl, workload_params={"limit": 2, "seed": 5},
                            engine="scripted", db=f"sqlite:///{tmp_path / 'once.sqlite'}")
    assert result.status == "completed" and result.completed == 2
    assert CountedBfcl.built == 1  # listed the tasks and ran the samples (it was built twice)
    assert len(opened) == 1, opened  # the API's store is the flow's (the flow opened a second one)


def bash_config(**params: object) -> BatchConfig:
    return BatchConfig.model_validate({"name": "Fix Repos", "workload": {"kind": "bash_tasks", "params": {
        "tasks": ["last-n", "is-even"], **params}}})


def test_sandbox_label_is_fixed_at_planning_and_kept_for_resume(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'label.sqlite'}")
    first, second = plan_batch(bash_config()), plan_batch(bash_config())
    label = first.config.workload.params["batch_label"]
    assert label.startswith("fix-repos-") and label != second.config.workload.params["batch_label"]
    assert first.workload.pool.batch_label == label  # the workload the run uses carries it
    batch_id = create_batch(first, store)
    stored = store.get_batch(batch_id).config
    assert stored["workload"]["params"]["batch_label"] == label
    assert batch_workload(store, batch_id).pool.batch_label == label  # what a resume or a worker builds
    # One suite, whatever each run's label: the label names sandboxes, not tasks.
    ids = [t[0] for t in first.tasks]
    assert history.config_suite_key(stored, ids) == history.config_suite_key(
        second.config.model_dump(mode="json"), ids)
    given = plan_batch(bash_config(batch_label="mine"))
    assert given.config.workload.params["batch_label"] == "mine" and given.workload.pool.batch_label == "mine"
    bfcl = BatchConfig.model_validate({"workload": {"kind": "bfcl", "params": {"limit": 1}}})
    assert "batch_label" not in plan_batch(bfcl).config.workload.params  # takes none
