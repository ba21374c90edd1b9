"""One way to start agentbatch's flow runs in this process.

`agentbatch run`, `resume`, `retry`, `join`, `gateway`, `replay --live`, the Python API
(`agentbatch.run`) and the scheduled evals (`deploy`, `serve`) all go through here, so each gets:

- the same Prefect server (`prepare_launch`): PREFECT_API_URL when set, else agentbatch's local
  server (started in the background once, reused by later runs; `flows/prefect_server.py`);
  `AGENTBATCH_PREFECT_SERVER=ephemeral` opts into Prefect's temporary server. Inside a running flow
  run the parent's server is kept (the batch is its subflow);
- lean Prefect defaults (a user's own environment wins) and log records with secrets hidden;
- flow-run parameters without secrets (`launch_flow`): the Prefect server keeps them in plain text,
  so a URL password or a secret-named field goes as an environment reference (`protocols/secrets.py`)
  that the flow resolves in this process.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from agentbatch.flows.prefect_server import PrefectApi, choose_api, wait_ready
from agentbatch.protocols.secrets import install_log_redaction, to_stored


class LaunchError(RuntimeError):
    """The run cannot start: a bad AGENTBATCH_PREFECT_SERVER, or a local server that did not come up."""


def quiet_prefect_defaults() -> None:
    """Prefect settings that keep a run lean; a user's own environment wins."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")
    os.environ.setdefault("PREFECT_TASKS_DEFAULT_NO_CACHE", "true")
    # Prefect's temporary server (AGENTBATCH_PREFECT_SERVER=ephemeral) logs harmless errors while it
    # shuts down with the process; keep those out of the user's terminal...
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "CRITICAL")
    # ...and give it time to start on a busy machine (Prefect's default is 20 s).
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def _parent_api() -> PrefectApi | None:
    """The server of the flow run this code runs inside, if any (Prefect is imported by then)."""
    if "prefect" not in sys.modules:
        return None
    from prefect.context import FlowRunContext
    from prefect.settings import get_current_settings

    if FlowRunContext.get() is None:
        return None
    url = get_current_settings().api.url
    return PrefectApi(url=str(url) if url else None, source="parent")


def prepare_launch(*, start_server: bool = True) -> PrefectApi:
    """Choose the Prefect API of this process's flow runs (a local server that has to start comes up
    in the background: `wait_for_prefect` waits for it), set the lean defaults and hide secrets in
    logs. Call it before Prefect is imported where possible (its settings are read at import);
    `launch_flow` applies the choice to a process that imported Prefect earlier."""
    install_log_redaction()
    quiet_prefect_defaults()
    if (parent := _parent_api()) is not None:
        return parent
    try:
        return choose_api(start=start_server)
    except ValueError as exc:  # a bad AGENTBATCH_PREFECT_SERVER
        raise LaunchError(str(exc)) from None


def wait_for_prefect(api: PrefectApi) -> None:
    """Wait for a local server that `prepare_launch` started (LaunchError if it does not come up)."""
    if api.source != "started":
        return
    try:
        wait_ready(api)
    except RuntimeError as exc:
        raise LaunchError(f"{exc} (AGENTBATCH_PREFECT_SERVER=ephemeral runs without a server)") from None


# API URL -> (the settings it updated, the updated copy)
_UPDATED: dict[str, tuple[Any, Any]] = {}


@contextlib.contextmanager
def _prefect_api(api: PrefectApi) -> Iterator[None]:
    """Prefect's settings pointed at the chosen API (they were read before the choice when Prefect was
    imported first, e.g. by a script that uses the Python API). Prefect's `temporary_settings`, with
    the copy made once per process, settings and URL: making it validates every setting again,
    ~20-40 ms of CPU on each batch a script runs."""
    from prefect.context import SettingsContext, get_settings_context
    from prefect.settings import PREFECT_API_URL

    context = get_settings_context()
    current = context.settings.api.url
    if api.url is None or api.source == "parent" or (str(current) if current else None) == api.url:
        yield
        return
    base, updated = _UPDATED.get(api.url, (None, None))
    if base is not context.settings:
        updated = context.settings.copy_with_update(updates={PREFECT_API_URL: api.url})
        _UPDATED[api.url] = (context.settings, updated)
    with SettingsContext(profile=context.profile, settings=updated):
        yield


async def launch_flow(flow_obj: Any, parameters: Mapping[str, Any], *, api: PrefectApi,
                      run_name: str | None = None, tags: Sequence[str] = ()) -> Any:
    """Run `flow_obj` as one flow run in this process, reporting to `api`; returns its result. The
    parameters the Prefect server records carry their secrets as environment references; the flow
    resolves them here (`from_stored`, `store_url.url_from_param`) or never needs them."""
    from prefect import tags as prefect_tags

    from agentbatch.flows.orphans import guard_prefect_server

    install_log_redaction()
    recorded = to_stored(dict(parameters))  # a password stays in this process's environment
    named = flow_obj.with_options(flow_run_name=run_name) if run_name else flow_obj
    with _prefect_api(api), prefect_tags(*tags):
        guard_prefect_server()  # Prefect's temporary server, if it starts one, dies with this process
        return await named(**recorded)


def apply_deployment(deployment: Any) -> Any:
    """Register (or update) a RunnerDeployment of a module-path flow; its runs work in this folder.

    Without a pull step a Prefect process worker (and `prefect flow-run execute`) copies its own
    working directory into a temporary workspace for every run, virtual environments included, and
    deletes it afterwards, with any store or file a relative path put there. The flows load by module
    path, so the one pull step only sets the folder. Returns the deployment's id."""
    from pathlib import Path

    from prefect import get_client
    from prefect.client.schemas.actions import DeploymentUpdate

    deployment_id = deployment.apply()
    here = [{"prefect.deployments.steps.set_working_directory": {"directory": str(Path.cwd().resolve())}}]
    with get_client(sync_client=True) as client:
        client.update_deployment(deployment_id, DeploymentUpdate(pull_steps=here))
    return deployment_id
