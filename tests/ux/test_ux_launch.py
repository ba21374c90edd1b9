"""One launch path (`flows/launch.py`): the Python API starts a batch as `agentbatch run` does.

- The store URL's password is in no flow-run parameter the Prefect server keeps (the API passed the
  raw URL before).
- Without PREFECT_API_URL, the API reports to the same Prefect server as the CLI: agentbatch's local
  server (it used Prefect's temporary one before, whose records die with the process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import make_url

import agentbatch
from agentbatch.flows.store_url import DB_PASSWORD_VARIABLE

pytestmark = [pytest.mark.slow]
CONFIG = {"name": "launch", "workload": {"kind": "bfcl", "params": {"limit": 2, "seed": 3}},
          "engine": {"kind": "scripted", "params": {"workers": 1}}}


def flow_runs(api_url: str, name: str) -> list[dict[str, Any]]:
    body = {"flow_runs": {"name": {"any_": [name]}}, "limit": 10}
    return httpx.post(f"{api_url}/flow_runs/filter", json=body, timeout=30).json()


@pytest.mark.postgres
def test_api_keeps_the_store_password_out_of_flow_run_parameters(prefect_api: str, pg_url: str) -> None:
    password = make_url(pg_url).password
    assert password, "the PostgreSQL test URL has a password"
    result = agentbatch.run(CONFIG, db=pg_url)
    assert result.status == "completed" and result.completed == 2
    runs = flow_runs(prefect_api, f"batch-{result.batch_id}-launch")
    assert len(runs) == 1, runs
    params = runs[0]["parameters"]
    assert make_url(params["db_url"]).password == f"${{{DB_PASSWORD_VARIABLE}}}"
    assert f":{password}@" not in json.dumps(params)
    assert make_url(params["db_url"]).database == make_url(pg_url).database  # still names the store


def _env(tmp_path: Path, prefect_api: str) -> dict[str, str]:
    """A process with no PREFECT_API_URL whose recorded local server is the test's Prefect server."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "prefect-server.json").write_text(json.dumps({"url": prefect_api, "pid": None, "log": None}))
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    # Its own PREFECT_HOME: a temporary Prefect server would otherwise share the test server's database.
    env.update(AGENTBATCH_HOME=str(home), AGENTBATCH_PREFECT_SERVER="local", PREFECT_HOME=str(tmp_path / "prefect"))
    return env


API_SCRIPT = """
import json, sys
import agentbatch
result = agentbatch.run(json.loads(sys.argv[1]), db=sys.argv[2])
print("batch", result.batch_id, result.status)
"""


def test_api_and_cli_report_to_the_same_local_server(prefect_api: str, tmp_path: Path) -> None:
    env = _env(tmp_path, prefect_api)
    db = f"sqlite:///{tmp_path / 'same.sqlite'}"
    api = subprocess.run([sys.executable, "-c", API_SCRIPT, json.dumps({**CONFIG, "name": "via-api"}), db],
                         env=env, capture_output=True, text=True, timeout=600)
    assert api.returncode == 0 and "completed" in api.stdout, api.stdout + api.stderr
    config = tmp_path / "cli.yaml"  # JSON is YAML
    config.write_text(json.dumps({**CONFIG, "name": "via-cli"}))
    cli = subprocess.run([sys.executable, "-m", "agentbatch.flows.cli", "run", str(config), "--db", db,
                          "--no-progress"], env=env, capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert f"Prefect server {prefect_api}" in cli.stdout  # the CLI's choice, as it prints it
    # Both flow runs are on that server: the API chose it as the CLI did.
    assert len(flow_runs(prefect_api, "batch-1-via-api")) == 1
    assert len(flow_runs(prefect_api, "batch-2-via-cli")) == 1
