"""Which Prefect API a batch reports to, and the local Prefect server that runs reuse.

Prefect's temporary server (no `PREFECT_API_URL`) starts inside each run (tens of seconds on a busy
machine), dies with the process and loses most task-run records. So, unless `PREFECT_API_URL` is
set, agentbatch reports to a local server that it starts once in the background and that later
runs reuse: the first run pays the server's start, the next ones find it up.

`AGENTBATCH_PREFECT_SERVER` chooses: `local` (the default, above) or `ephemeral` (Prefect's
temporary server, nothing left running). The server's address and process id are kept in
`$AGENTBATCH_HOME/prefect-server.json` (default `~/.agentbatch/`); `agentbatch server stop` ends it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

MODES = ("local", "ephemeral")
DEFAULT_PORT = 4200
STARTUP_TIMEOUT_S = 180.0


@dataclass
class PrefectApi:
    """Where this process's flow runs go."""

    url: str | None  # None: Prefect's temporary server
    source: str  # "configured" (PREFECT_API_URL), "reused", "started", "ephemeral" or "parent" (a flow run's)
    pid: int | None = None
    log: str | None = None

    def describe(self) -> str:
        if self.source == "configured":
            return f"Prefect API {self.url} (PREFECT_API_URL)"
        if self.source == "reused":
            return f"Prefect server {self.url} (running since an earlier run; UI at {ui_url(self.url)})"
        if self.source == "started":
            return (f"Prefect server started in the background at {self.url} (UI at {ui_url(self.url)}); later runs "
                    "reuse it; `agentbatch server stop` ends it")
        if self.source == "parent":
            return f"Prefect API {self.url or '(temporary server)'} (of the calling flow run)"
        return "Prefect's temporary server (gone with this process; set AGENTBATCH_PREFECT_SERVER=local to keep one)"


def ui_url(api_url: str | None) -> str:
    return (api_url or "").removesuffix("/api")


def home() -> Path:
    return Path(os.environ.get("AGENTBATCH_HOME", "~/.agentbatch")).expanduser()


def state_file() -> Path:
    return home() / "prefect-server.json"


def mode() -> str:
    value = os.environ.get("AGENTBATCH_PREFECT_SERVER", "local").strip().lower() or "local"
    if value not in MODES:
        raise ValueError(f"AGENTBATCH_PREFECT_SERVER={value!r}: expected one of {', '.join(MODES)}")
    return value


def healthy(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as r:  # noqa: S310 - local URL
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def read_state() -> PrefectApi | None:
    try:
        data = json.loads(state_file().read_text())
        return PrefectApi(url=data["url"], source="reused", pid=data.get("pid"), log=data.get("log"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def running_server() -> PrefectApi | None:
    """The recorded local server when it answers its health check."""
    state = read_state()
    return state if state is not None and state.url and healthy(state.url) else None


def free_port(preferred: int = DEFAULT_PORT) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError("no free TCP port on 127.0.0.1")


def start_server(port: int | None = None) -> PrefectApi:
    """Start `prefect server start` detached from this process (it outlives the run) and record it."""
    home().mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    log = home() / "prefect-server.log"
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )
    api = PrefectApi(url=f"http://127.0.0.1:{port}/api", source="started", pid=proc.pid, log=str(log))
    state_file().write_text(json.dumps(asdict(api)))
    return api


def wait_ready(api: PrefectApi, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not healthy(api.url or ""):
        if api.pid is not None and not _alive(api.pid):
            raise RuntimeError(f"the Prefect server exited while starting; see {api.log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Prefect server did not answer within {timeout_s:.0f} s; see {api.log}")
        time.sleep(0.3)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A child that exited but was not reaped yet still "exists": ask waitpid without blocking.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True  # not our child: it exists
    return done == 0


def stop_server() -> PrefectApi | None:
    """Stop the recorded local server (its whole process group); returns what was stopped."""
    state = read_state()
    if state is None:
        return None
    if state.pid is not None and _alive(state.pid):
        try:
            os.killpg(state.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + 20
        while _alive(state.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(state.pid):
            os.killpg(state.pid, signal.SIGKILL)
    state_file().unlink(missing_ok=True)
    return state


def choose_api(*, start: bool = True) -> PrefectApi:
    """The Prefect API for this process: PREFECT_API_URL, else the local server (started when it is
    not running and `start`), else Prefect's temporary server. Sets PREFECT_API_URL for the local
    server; call it before Prefect is imported (its settings are read at import)."""
    if url := os.environ.get("PREFECT_API_URL"):
        return PrefectApi(url=url, source="configured")
    if mode() == "ephemeral":
        return PrefectApi(url=None, source="ephemeral")
    api = running_server()
    if api is None and start:
        api = start_server()
    if api is None:
        return PrefectApi(url=None, source="ephemeral")
    os.environ["PREFECT_API_URL"] = api.url or ""
    return api
