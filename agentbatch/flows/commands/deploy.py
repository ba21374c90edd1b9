"""`agentbatch deploy CONFIG --name NAME (--cron EXPR | --interval SECONDS) [--param KEY=VALUE ...]`:
register a scheduled eval as a Prefect deployment."""

from __future__ import annotations

import argparse
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentbatch.flows.commands._common import add_db_option, fail

if TYPE_CHECKING:  # Prefect is imported only after the server is chosen
    from agentbatch.flows.deployments import DeploySpec
    from agentbatch.flows.prefect_server import PrefectApi

SERVER_HINT = ("deployments live on a running Prefect server: `agentbatch server start` (a local one), or "
               "`prefect server start` and PREFECT_API_URL=http://HOST:4200/api; Prefect's temporary server "
               "lives only as long as one command, so nothing would ever fire the schedule")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "deploy", help="register a scheduled eval (a Prefect deployment of the batch flow)",
        description="Register (or update) a Prefect deployment that runs CONFIG on a schedule: each run "
        "creates a batch linked to its flow run and deployment, uses the suite's earlier chain lengths as "
        "priors, and publishes a markdown artifact with its diff against the suite's previous run. "
        "Needs a running Prefect server (PREFECT_API_URL). Runs execute under `agentbatch serve` (this "
        "machine) or, with --work-pool, under `prefect worker start --pool POOL` (any machine). "
        "The config and every override are validated before anything is registered (exit 2).",
    )
    p.add_argument("config", type=Path, help="batch config file (.yaml, .yml, .toml)")
    p.add_argument("--name", required=True, help="deployment name (letters, digits, - and _)")
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help='cron schedule, e.g. "0 2 * * *" (02:00 UTC every night)')
    when.add_argument("--interval", type=float, metavar="SECONDS",
                      help="run every SECONDS seconds (the first run one interval after deploy, or at --anchor)")
    p.add_argument("--anchor", type=_anchor, default=None, metavar="TIME",
                   help="with --interval: runs fall on TIME + k x SECONDS; TIME is ISO 8601 "
                   "(2026-12-04T02:00:00+00:00; UTC when no offset is given)")
    p.add_argument("--on-event", default=None, metavar="EVENT",
                   help="also start a run for each Prefect event named EVENT (e.g. emitted by a training job "
                   "after each checkpoint), tagged with the event's resource name; see docs/history.md")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted config field (engine.params.endpoints.0.model=ckpt-12; values are "
                   "JSON when they parse as JSON, else strings); tag=NAME labels the runs (checkpoint tag). "
                   "Repeatable")
    add_db_option(p)
    p.add_argument("--threshold", type=float, default=0.0,
                   help="a task or group whose score falls by more than this is flagged as a regression (default 0: any drop)")
    p.add_argument("--makespan-threshold", type=float, default=None, metavar="RATIO",
                   help="flag a makespan more than (1 + RATIO) x the previous run's (off by default)")
    p.add_argument("--report-dir", type=Path, default=None, metavar="DIR",
                   help="write each run's HTML report to DIR/batch-<id>/ (on the machine that runs it)")
    p.add_argument("--work-pool", default=None, metavar="POOL",
                   help="a Prefect work pool (type process) whose workers run it, instead of `agentbatch serve`")
    p.add_argument("--by-path", action="store_true",
                   help="store the config file's path, read where each run executes, instead of its content "
                   "(for configs that carry secrets such as API keys)")
    p.set_defaults(func=main)


def _anchor(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time such as 2026-12-04T02:00:00+00:00, got {text!r}") from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _db_parameter(db: str | None) -> str | None:
    """What the deployment stores as the store URL; never a password (parameters are plain text)."""
    from agentbatch.db.engine import resolve_url
    from agentbatch.flows.overrides import find_secrets

    if db:
        if find_secrets(db):
            raise ValueError("--db: the URL holds a password, and deployment parameters are stored in plain "
                             "text on the Prefect server; give it as a reference (postgresql+psycopg://USER:"
                             "${PGPASSWORD}@HOST/DB, the variable set where the runs execute), or without the "
                             "password and set AGENTBATCH_DB_URL (or ~/.pgpass) there")
        return db
    if os.environ.get("AGENTBATCH_DB_URL"):
        return None  # resolved where each run executes, from its own environment
    return resolve_url(None)  # the SQLite file this command would use, as an absolute path


def pick_server() -> PrefectApi | str:
    """Choose the Prefect API before Prefect is imported, as every launch does (`flows/launch.py`):
    PREFECT_API_URL, else agentbatch's local server (started in the background when it is not
    running). Returns the problem when there is no server to use."""
    from agentbatch.flows.commands._launch import start_prefect

    api = start_prefect()
    if api.url is None:
        return f"AGENTBATCH_PREFECT_SERVER=ephemeral: {SERVER_HINT}"
    return api


def server_ready(api: PrefectApi) -> str | None:
    """Wait for a local server that is starting, then check that the API answers."""
    from agentbatch.flows.commands._launch import ready_prefect

    if problem := ready_prefect(api, quiet=True):
        return problem
    return api_silent(api.url or "")


def api_silent(url: str) -> str | None:
    """None when the Prefect API at `url` answers its health check, else the problem."""
    import httpx

    url = url.rstrip("/")
    try:
        httpx.get(f"{url}/health", timeout=10).raise_for_status()
    except httpx.HTTPError as exc:
        return f"the Prefect server at {url} does not answer ({exc.__class__.__name__}); {SERVER_HINT}"
    return None


def main(args: argparse.Namespace) -> int:
    from agentbatch.flows.config import ConfigError, load_config
    from agentbatch.flows.overrides import OverrideError, apply_overrides, find_secrets, override_secrets

    if problem := _schedule_problem(args):
        return fail(problem)
    if given := override_secrets(args.param):
        return fail(f"--param {', '.join(given)}: a secret given as a value would be stored in plain text on the "
                    "Prefect server (deployment, flow runs, events); give it as a reference to a variable set "
                    "where the runs execute, e.g. --param 'KEY=${MY_API_KEY}'")
    try:
        config, tag = apply_overrides(load_config(args.config), args.param)
        db = _db_parameter(args.db)
    except (ConfigError, OverrideError, ValueError) as exc:
        return fail(str(exc))
    data = config.model_dump(mode="json")
    secrets = find_secrets(data)
    if secrets and not args.by_path:
        return fail(f"{args.config}: {', '.join(secrets)} look(s) like secrets, and deployment parameters are "
                    "stored in plain text on the Prefect server; write them as references (api_key: "
                    "${MY_API_KEY}, the variable set where the runs execute), deploy with --by-path (the file "
                    "is read where each run executes) or leave them out")
    api = pick_server()
    if isinstance(api, str):
        return fail(api)
    from agentbatch.db.history import config_suite_key
    from agentbatch.flows.batch import workload_tasks
    from agentbatch.flows.deployments import DeploySpec

    try:  # the workload's task list: the suite, and a workload that cannot run is caught here
        tasks = workload_tasks(config)
    except (ValueError, KeyError, FileNotFoundError) as exc:
        return fail(f"{args.config}: {exc}")
    if problem := server_ready(api):
        return fail(problem)
    return _register(args, DeploySpec(name=args.name, parameters=_parameters(args, data, tag, db), cron=args.cron, interval_s=args.interval,
                                      anchor=args.anchor, on_event=args.on_event, work_pool=args.work_pool,
                                      description=f"agentbatch scheduled eval of {args.config.name}"),
                     config_suite_key(data, [t[0] for t in tasks]), len(tasks))


def _schedule_problem(args: argparse.Namespace) -> str | None:
    if args.interval is not None and args.interval <= 0:
        return f"--interval: expected a positive number of seconds, got {args.interval:g}"
    if args.anchor is not None and args.interval is None:
        return "--anchor: only with --interval"
    return None


def _parameters(args: argparse.Namespace, data: dict[str, Any], tag: str | None, db: str | None) -> dict[str, Any]:
    """The deployment's parameters (the scheduled_eval flow's arguments)."""
    params: dict[str, Any] = {"tag": tag, "db_url": db, "score_threshold": args.threshold,
                              "makespan_threshold": args.makespan_threshold,
                              "report_dir": str(args.report_dir.resolve()) if args.report_dir else None}
    params.update({"config_path": str(args.config.resolve()), "overrides": args.param} if args.by_path
                  else {"config": data})
    return params


def _register(args: argparse.Namespace, spec: DeploySpec, suite: str, n_tasks: int) -> int:
    from agentbatch.flows.deployments import FLOW_NAME, deploy

    try:
        deployment_id = deploy(spec)
    except ValueError as exc:  # a bad cron expression or deployment name, an unknown work pool
        return fail(f"cannot register the deployment: {exc}")
    when = f"cron {args.cron!r}" if args.cron else f"every {args.interval:g} s"
    when += f", and on each event {args.on_event!r}" if args.on_event else ""
    print(f"deployment {FLOW_NAME}/{args.name} ({deployment_id}) registered: {when}, suite {suite} "
          f"({n_tasks} tasks)")
    if args.work_pool:
        print(f"runs execute on the workers of pool {args.work_pool}: prefect worker start --pool {args.work_pool}")
    else:
        print(f"runs execute while `agentbatch serve {args.name}` runs (the schedule is paused otherwise)")
    return 0
