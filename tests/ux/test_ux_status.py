"""`status` and `report` never create a store; a batch whose process stopped beating shows as crashed,
in `status` and in Prefect (its flow run is set to Crashed)."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from pathlib import Path

import pytest

from agentbatch.db.store import Store
from agentbatch.flows.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dashboards"))
from dashboards_batches import KNOWN_CONFIG, known_samples, write_batch  # noqa: E402


@pytest.mark.parametrize("command", ["status", "report"])
def test_read_only_commands_create_nothing(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AGENTBATCH_DB_URL", raising=False)
    monkeypatch.delenv("AGENTBATCH_DB_PATH", raising=False)
    assert main([command, "1"]) == 2  # the default store ./agentbatch.sqlite does not exist
    err = capsys.readouterr().err
    assert "no store at" in err and "agentbatch.sqlite" in err and "--db" in err
    missing = tmp_path / "demo.sqlite"
    assert main([command, "1", "--db", f"sqlite:///{missing}"]) == 2
    assert "no store at" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no file, no folder


def unfinished(store: Store, heartbeat_age_s: float, flow_run_id: str | None = None) -> int:
    """A batch marked running with two finished samples and two admitted but unfinished ones."""
    samples = known_samples()
    for x in samples[2:]:
        x.update(status="running", finished=None, score=None)
    bid = write_batch(store, samples, config=KNOWN_CONFIG, workers=("w0", "w1"), status="running",
                      heartbeat_at=time.time() - heartbeat_age_s)
    if flow_run_id:
        from agentbatch.db.models import Batch

        with store.session() as s, s.begin():
            s.get_one(Batch, bid).flow_run_id = flow_run_id
    return bid


def test_fresh_heartbeat_is_running(sqlite_url, capsys):
    store = Store(sqlite_url)
    bid = unfinished(store, heartbeat_age_s=2.0)
    store.close()
    assert main(["status", str(bid), "--db", sqlite_url]) == 0
    out = capsys.readouterr().out
    assert f"batch {bid} (known): running" in out and "crashed" not in out and "ETA" in out


def test_stale_heartbeat_is_crashed_in_status_and_prefect(prefect_api, sqlite_url, capsys):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    @flow(name="agentbatch-batch")
    def stand_in() -> None:  # a flow run left Running by a killed process
        pass

    async def create() -> str:
        async with get_client() as c:
            run = await c.create_flow_run(stand_in, name="batch-x-killed", state=Running())
            return str(run.id)

    async def state(run_id: str) -> str:
        async with get_client() as c:
            return (await c.read_flow_run(run_id)).state.type.value

    run_id = asyncio.run(create())
    store = Store(sqlite_url)
    bid = unfinished(store, heartbeat_age_s=600.0, flow_run_id=run_id)
    store.close()
    assert main(["status", str(bid), "--db", sqlite_url]) == 0
    out = capsys.readouterr().out
    assert f"batch {bid} (known): crashed" in out
    # 600 s old when written; a loaded machine may take seconds more to reach `status`.
    assert re.search(r"no heartbeat for 10m[0-5]\ds", out) and f"agentbatch resume {bid}" in out
    assert "ETA       unknown" in out and "marked Crashed" in out
    assert asyncio.run(state(run_id)) == "CRASHED"
    # The store is read, never written: the batch row still says running.
    store = Store(sqlite_url)
    assert store.get_batch(bid).status == "running"
    store.close()


def test_each_command_is_found_in_its_own_module() -> None:
    """The CLI imports only the module of the command it runs: every command, and every help, is found so."""
    import argparse

    from agentbatch.flows.cli import build_parser, command_module

    full = build_parser()
    names = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {"run", "create", "status", "serve-sim", "gateway", "whatif"} <= set(names)
    for name in names:
        assert command_module([name]) is not None, f"`agentbatch {name}`: add its module to cli.COMMAND_MODULES"
        only = build_parser(command_module(["-v", name, "--x"]))
        sub = next(a for a in only._actions if isinstance(a, argparse._SubParsersAction))
        assert name in sub.choices, f"`agentbatch {name}` is not registered by module {command_module([name])}"
    assert command_module(["no-such-command"]) is None and command_module(["--help"]) is None
