"""Suite identity, priors by suite (stated in the summary), and `--param` overrides."""

from __future__ import annotations

import asyncio

import pytest
from history_helpers import TASKS, cli, config, write_config

from agentbatch.dashboards.summary import summarize
from agentbatch.db import history
from agentbatch.db.store import Store
from agentbatch.flows.batch import create_batch, execute_batch
from agentbatch.flows.config import BatchConfig
from agentbatch.flows.overrides import OverrideError, apply_overrides, find_secrets


def run_plain(store: Store, data: dict) -> int:
    batch_id = create_batch(BatchConfig.model_validate(data), store)
    asyncio.run(execute_batch(store, batch_id, use_prefect=False, show_progress=False))
    return batch_id


def test_suite_key_is_workload_params_and_task_set() -> None:
    a = history.suite_key("bfcl", {"task_ids": TASKS}, TASKS)
    assert a == history.suite_key("bfcl", {"task_ids": TASKS}, list(reversed(TASKS)))  # a set of tasks
    assert a != history.suite_key("bfcl", {"task_ids": TASKS, "seed": 1}, TASKS)
    assert a != history.suite_key("mcp", {"task_ids": TASKS}, TASKS)
    assert a != history.suite_key("bfcl", {"task_ids": TASKS}, TASKS[:3])


def test_priors_come_from_the_suite_and_the_summary_says_so(store: Store) -> None:
    first = run_plain(store, config())
    assert history.priors_used(store, first).source is None
    assert "priors        none" in summarize(store, first).to_text()

    # Same task ids, other params (another suite): the store-wide fallback, said as such.
    other = config(name="other")
    other["workload"]["params"]["limit"] = 4
    stranger = run_plain(store, other)
    p = history.priors_used(store, stranger)
    assert (p.source, p.runs, p.tasks) == ("task_ids", 1, 4)
    assert history.suite_row(store, stranger).suite_key != history.suite_row(store, first).suite_key

    second = run_plain(store, config())
    p = history.priors_used(store, second)
    assert (p.source, p.runs, p.tasks) == ("suite", 1, 4)  # the suite's own run, not the stranger
    assert f"from 1 earlier run of suite {p.suite_key}" in summarize(store, second).to_text()
    lengths = history.suite_priors(store, second, TASKS).lengths
    assert lengths == {s.task_id: float(s.steps_done) for s in store.samples(first)}

    third = run_plain(store, config())
    assert history.priors_used(store, third).runs == 2
    assert history.previous_run(store, third) == second
    assert [r.batch_id for r in history.suite_runs(store, p.suite_key)] == [first, second, third]
    assert history.resolve_suites(store, p.suite_key[:6]) == [p.suite_key]
    assert set(history.resolve_suites(store, "nightly")) == {p.suite_key}


def test_overrides_set_dotted_fields_and_are_validated() -> None:
    base = BatchConfig.model_validate(config({"kind": "openai", "params": {
        "endpoints": [{"name": "w0", "base_url": "http://gpu0:8000/v1", "model": "ckpt-1"}]}}))
    cfg, tag = apply_overrides(base, ["engine.params.endpoints.0.model=ckpt-2", "scheduling.env_slots=3",
                                      "tag=ckpt-2"])
    assert cfg.engine.params["endpoints"][0]["model"] == "ckpt-2"
    assert cfg.scheduling.env_slots == 3 and tag == "ckpt-2"
    for bad, named in [("scheduling.env_slots=0", "scheduling.env_slots"),
                       ("scheduling.max_activ=3", "scheduling.max_activ"),
                       ("engine.params.endpoints.5.model=x", "engine.params.endpoints.5"),
                       ("name.x=1", "name"), ("noequals", "noequals")]:
        with pytest.raises(OverrideError, match=named.replace(".", r"\.")):
            apply_overrides(base, [bad])
    assert find_secrets({"engine": {"params": {"endpoints": [{"api_key": "sk-1"}]}},
                         "x": "postgresql://u:pw@h/db", "max_tokens": 5}) == \
        ["engine.params.endpoints.0.api_key", "x"]


def test_deploy_refuses_bad_input_before_registering(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("AGENTBATCH_PREFECT_SERVER", "ephemeral")  # no local server either
    path = write_config(tmp_path / "eval.yaml", config())
    assert cli("deploy", str(path), "--name", "n", "--interval", "30", "--param", "scheduling.env_slots=-1") == 2
    assert "scheduling.env_slots" in capsys.readouterr().err
    assert cli("deploy", str(path), "--name", "n", "--interval", "0") == 2
    secret = config({"kind": "openai", "params": {"endpoints": [
        {"name": "w0", "base_url": "http://gpu0:8000/v1", "model": "m", "api_key": "sk-123"}]}})
    assert cli("deploy", str(write_config(tmp_path / "s.yaml", secret)), "--name", "n", "--cron", "0 2 * * *") == 2
    err = capsys.readouterr().err
    assert "engine.params.endpoints.0.api_key" in err and "sk-123" not in err
    # A valid config without a server: the reason deployments need one.
    assert cli("deploy", str(path), "--name", "n", "--interval", "30", "--db", f"sqlite:///{tmp_path}/x.sqlite") == 2
    assert "temporary server" in capsys.readouterr().err
    assert not (tmp_path / "x.sqlite").exists()


def test_history_and_diff_commands(store: Store, capsys) -> None:
    first = run_plain(store, config())
    assert cli("history", "--db", store.url) == 0
    key = history.suite_row(store, first).suite_key
    assert f"suite {key}  bfcl, 4 tasks, 1 run(s), last batch {first}; names nightly" in capsys.readouterr().out
    assert cli("history", "no-such-suite", "--db", store.url) == 2
    assert "no suite, deployment or batch named 'no-such-suite'" in capsys.readouterr().err
    assert cli("diff", str(first), "--db", store.url) == 2  # a suite's first run: nothing before it
    assert "first finished run" in capsys.readouterr().err
    assert cli("diff", str(first), "999", "--db", store.url) == 2
    assert "no batch with id 999" in capsys.readouterr().err
    second = run_plain(store, config())
    assert cli("diff", str(second), "--db", store.url) == 0  # against the previous run of the suite
    out = capsys.readouterr().out
    assert f"batch {first} (scripted" in out and "regressions: 0 task(s)" in out
