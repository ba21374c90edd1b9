"""Which Prefect API a run reports to, and the local server that runs reuse (`agentbatch server`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agentbatch.flows import prefect_server as ps


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTBATCH_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AGENTBATCH_PREFECT_SERVER", "local")
    return tmp_path / "home"


def record(home, url: str, pid: int | None = None) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "prefect-server.json").write_text(json.dumps({"url": url, "pid": pid, "log": None}))


def test_a_recorded_server_that_answers_is_reused(prefect_api, home, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL")
    record(home, prefect_api)
    api = ps.choose_api(start=False)
    assert api.source == "reused" and api.url == prefect_api
    assert os.environ["PREFECT_API_URL"] == prefect_api  # for the Prefect import that follows
    assert "running since an earlier run" in api.describe()


def test_configured_ephemeral_and_dead(prefect_api, home, monkeypatch):
    assert ps.choose_api().source == "configured"  # PREFECT_API_URL wins, nothing started
    monkeypatch.delenv("PREFECT_API_URL")
    record(home, f"http://127.0.0.1:{ps.free_port(0)}/api")  # nothing listens there
    assert ps.running_server() is None
    assert ps.choose_api(start=False).source == "ephemeral"
    monkeypatch.setenv("AGENTBATCH_PREFECT_SERVER", "ephemeral")
    assert ps.choose_api().url is None
    monkeypatch.setenv("AGENTBATCH_PREFECT_SERVER", "sometimes")
    with pytest.raises(ValueError, match="AGENTBATCH_PREFECT_SERVER='sometimes': expected one of local, ephemeral"):
        ps.choose_api()


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentbatch.flows.cli", *args], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_server_start_status_stop(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(AGENTBATCH_HOME=str(tmp_path / "home"), PREFECT_HOME=str(tmp_path / "prefect"),
               AGENTBATCH_PREFECT_SERVER="local", PREFECT_UI_ENABLED="false")
    port = ps.free_port(0)
    r = _cli(["server", "start", "--port", str(port)], env)
    state = json.loads((tmp_path / "home" / "prefect-server.json").read_text())
    try:
        assert r.returncode == 0, r.stderr + (tmp_path / "home" / "prefect-server.log").read_text()[-2000:]
        assert f"running at http://127.0.0.1:{port}/api" in r.stdout
        assert ps.healthy(state["url"])
        again = _cli(["server", "start"], env)  # already up: reused, not a second server
        assert again.returncode == 0 and f"(pid {state['pid']})" in again.stdout
        assert _cli(["server", "status"], env).returncode == 0
    finally:
        stop = _cli(["server", "stop"], env)
    assert stop.returncode == 0 and f"pid {state['pid']}" in stop.stdout
    with pytest.raises(ProcessLookupError):
        os.kill(state["pid"], 0)
    assert not (tmp_path / "home" / "prefect-server.json").exists()
    assert _cli(["server", "status"], env).returncode == 1
