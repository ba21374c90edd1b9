"""Secrets through every way they arrive, one masking rule (`protocols/secrets.py`).

Distinct secrets planted through each path, then looked for everywhere they could land:
- `agentbatch run`: an API key in the config, a password in a URL's userinfo, and `?password=` in
  the store URL;
- the Python API (`agentbatch.run`): an API key argument and `?password=` in its `db` argument;
- `agentbatch deploy --param`: a literal secret is refused (exit 2, not echoed); `${VAR}` references
  (config field, `--param`, a URL password) are accepted, and the deployment's own flow run, executed
  as a worker executes it, resolves them;
- `agentbatch join` with the secret's variable unset: exit 2 naming the variable.
Places searched: the SQLite stores' file bytes, every command's output (debug logging on), and
the Prefect server's flow runs, deployments and events (read through its API).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from reliability_helpers import bfcl_config, cli_env, write_config

from agentbatch.db.store import Store
from agentbatch.engines.sim_server import running_sim_server
from agentbatch.flows.deployments import FLOW_NAME

pytestmark = [pytest.mark.slow]
PLANTED = {
    "run: config api_key": "sk-RUNKEY-7c1d93",
    "run: URL userinfo password": "pw-USERINFO-41e0",
    "run: store URL ?password=": "pw-QUERYDB-8b27",
    "api: api_key argument": "sk-APIARG-2f6e55",
    "api: db ?password=": "pw-APIQUERY-9d03",
    "deploy: --param literal": "sk-PARAMLIT-60ab",
    "deploy: --param ${VAR} value": "sk-PARAMREF-13c9",
    "deploy: config ${VAR} value": "sk-CFGREF-77e4",
    "deploy: URL ${VAR} password": "pw-URLREF-5a18",
}


def cli(args: list[str], url: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agentbatch.flows.cli", *args], env=cli_env(url, **env),
                          capture_output=True, text=True, timeout=600)


def sim_engine(name: str, base_url: str, api_key: str) -> dict[str, Any]:
    return {"kind": "openai", "params": {"endpoints": [
        {"name": name, "base_url": base_url, "model": "tiny-cpu", "api_key": api_key}]}}


def file_bytes(path: Path) -> str:
    return "".join(p.read_bytes().decode("latin-1") for p in path.parent.glob(path.name + "*"))


def prefect_records(api_url: str) -> dict[str, str]:
    """The server's flow runs, deployments and events (newest first), as text."""
    runs = httpx.post(f"{api_url}/flow_runs/filter", json={"limit": 200, "sort": "EXPECTED_START_TIME_DESC"},
                      timeout=30).json()
    deployments = httpx.post(f"{api_url}/deployments/filter", json={"limit": 200}, timeout=30).json()
    page = httpx.post(f"{api_url}/events/filter", json={"limit": 50}, timeout=30).json()
    events = list(page.get("events", []))
    for _ in range(40):  # the run's events, page by page
        if not page.get("next_page"):
            break
        page = httpx.get(page["next_page"], timeout=30).json()
        events += page.get("events", [])
    return {"flow runs": str(runs), "deployments": str(deployments), "events": str(events)}


async def execute_deployment(name: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A flow run of the deployment, executed as a Prefect worker executes one."""
    from prefect import get_client

    async with get_client() as client:
        deployment = await client.read_deployment_by_name(f"{FLOW_NAME}/{name}")
        run = await client.create_flow_run_from_deployment(deployment.id)
    return subprocess.run([sys.executable, "-m", "prefect", "flow-run", "execute", str(run.id)], env=env,
                          capture_output=True, text=True, timeout=600)


API_SCRIPT = """
import sys, yaml, agentbatch
cfg = yaml.safe_load(open(sys.argv[1]))
endpoint = {**cfg["engine"]["params"]["endpoints"][0], "api_key": sys.argv[3]}
print(agentbatch.run(cfg, db=sys.argv[2], engine_params={"endpoints": [endpoint]}))
"""


def test_secrets_through_every_path(tmp_path: Path, prefect_api: str) -> None:
    outputs: list[str] = []
    run_db, api_db, deploy_db = (tmp_path / n for n in ("run.sqlite", "api.sqlite", "deploy.sqlite"))
    with running_sim_server("tiny-cpu", worker_name="sim-p") as base:
        host = base.removeprefix("http://")
        # 1. run: config key, userinfo password, ?password= in the store URL
        cfg = {**bfcl_config("paths-run", limit=1), "engine": sim_engine(
            "sim-p", f"http://agent:{PLANTED['run: URL userinfo password']}@{host}", PLANTED["run: config api_key"])}
        run_url = f"sqlite:///{run_db}?password={PLANTED['run: store URL ?password=']}"
        done = cli(["-v", "run", str(write_config(tmp_path, cfg)), "--no-progress"], run_url)
        outputs.append(done.stdout + done.stderr)
        assert done.returncode in (0, 1), outputs[-1]
        store = Store(f"sqlite:///{run_db}")
        assert store.list_batches(), outputs[-1]
        batch = store.list_batches()[0]
        assert all(s.status == "completed" for s in store.samples(batch.id))  # every secret reached its use
        store.close()

        # join in a process without the key's variable: exit 2, the variable named, nothing run
        joined = cli(["join", str(batch.id), "--no-progress"], f"sqlite:///{run_db}")
        outputs.append(joined.stdout + joined.stderr)
        assert joined.returncode == 2, outputs[-1]
        assert "AGENTBATCH_SECRET_ENGINE_PARAMS_ENDPOINTS_0_API_KEY" in joined.stderr
        assert "Traceback" not in outputs[-1]

        # 2. the Python API: an api_key argument, ?password= in db
        api_cfg = {**bfcl_config("paths-api", limit=1), "engine": sim_engine("sim-p", base, "unused")}
        api_cfg["engine"]["params"]["endpoints"][0].pop("api_key")
        cfg_path = write_config(tmp_path, api_cfg)
        script = tmp_path / "api_run.py"
        script.write_text(API_SCRIPT)
        api = subprocess.run([sys.executable, str(script), str(cfg_path),
                              f"sqlite:///{api_db}?password={PLANTED['api: db ?password=']}",
                              PLANTED["api: api_key argument"]], env=cli_env(""), capture_output=True, text=True,
                             timeout=600)
        outputs.append(api.stdout + api.stderr)
        assert api.returncode == 0 and "completed" in api.stdout, outputs[-1]

        # 3. deploy: a literal secret in --param is refused before anything is registered
        dep_cfg = {**bfcl_config("paths-deploy", limit=1),
                   "engine": sim_engine("sim-p", base, "${PLANTED_CFG_KEY}")}
        dep_path = write_config(tmp_path, dep_cfg)
        deploy_url = f"sqlite:///{deploy_db}"
        refused = cli(["deploy", str(dep_path), "--name", "secret-paths-lit", "--interval", "86400", "--db",
                       deploy_url, "--param", f"engine.params.endpoints.0.api_key={PLANTED['deploy: --param literal']}"],
                      deploy_url)
        outputs.append(refused.stdout + refused.stderr)
        assert refused.returncode == 2 and "engine.params.endpoints.0.api_key" in refused.stderr, outputs[-1]

        # ... references are accepted (config, --param, URL password) and resolved where the run executes
        registered = cli(["deploy", str(dep_path), "--name", "secret-paths", "--interval", "86400", "--db", deploy_url,
                          "--param", "engine.params.endpoints.0.api_key=${PLANTED_PARAM_KEY}",
                          "--param", f"engine.params.endpoints.0.base_url=http://agent:${{PLANTED_URL_PW}}@{host}"],
                         deploy_url)
        outputs.append(registered.stdout + registered.stderr)
        assert registered.returncode == 0, outputs[-1]
        env = cli_env(deploy_url, PLANTED_CFG_KEY=PLANTED["deploy: config ${VAR} value"],
                      PLANTED_PARAM_KEY=PLANTED["deploy: --param ${VAR} value"],
                      PLANTED_URL_PW=PLANTED["deploy: URL ${VAR} password"])
        executed = asyncio.run(execute_deployment("secret-paths", env))
        outputs.append(executed.stdout + executed.stderr)
        assert executed.returncode == 0, outputs[-1]
        store = Store(deploy_url)
        runs = store.list_batches()
        assert len(runs) == 1 and all(s.status == "completed" for s in store.samples(runs[0].id))
        endpoint = runs[0].config["engine"]["params"]["endpoints"][0]
        assert endpoint["api_key"] == "${PLANTED_PARAM_KEY}" and "${PLANTED_URL_PW}" in endpoint["base_url"]
        store.close()

    places = {"store " + p.name: file_bytes(p) for p in (run_db, api_db, deploy_db)}
    places["output"] = "\n".join(outputs)
    places.update(prefect_records(prefect_api))
    assert "secret-paths" in places["deployments"] and "paths-run" in places["flow runs"]
    for where, text in places.items():
        for how, secret in PLANTED.items():
            assert secret not in text, f"{secret} ({how}) found in the {where}"


def test_deploy_reference_in_db_url_is_accepted(tmp_path: Path, prefect_api: str) -> None:
    """`--db` with its password as `${VAR}` (it was refused as a secret), a literal one still refused."""
    cfg_path = write_config(tmp_path, bfcl_config("paths-db", limit=1))
    pg = "postgresql+psycopg://agentbatch:{}@127.0.0.1:5432/agentbatch_test"
    literal = cli(["deploy", str(cfg_path), "--name", "paths-db-lit", "--cron", "0 2 * * *",
                   "--db", pg.format("pw-DBLIT-3e2a")], "")
    assert literal.returncode == 2 and "pw-DBLIT-3e2a" not in literal.stdout + literal.stderr
    ref = cli(["deploy", str(cfg_path), "--name", "paths-db-ref", "--cron", "0 2 * * *",
               "--db", pg.format("${PGPASSWORD}")], "")
    assert ref.returncode == 0, ref.stdout + ref.stderr
    deployments = httpx.post(f"{prefect_api}/deployments/filter", json={"limit": 200}, timeout=30).json()
    stored = [d["parameters"]["db_url"] for d in deployments if d["name"] == "paths-db-ref"]
    assert stored == [pg.format("${PGPASSWORD}")]
