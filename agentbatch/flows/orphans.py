"""No orphans: the servers a run starts as its children die with it, even on SIGKILL.

Prefect's temporary API server (used when no Prefect API is configured) is a uvicorn subprocess that
Prefect starts with a plain `subprocess.Popen`; killed with SIGKILL, the run left it running.
`guard_prefect_server` gives Prefect's server module a `subprocess` whose `Popen` adds
`die_with_parent` (protocols/children.py) to the child.
"""

from __future__ import annotations

import subprocess
from typing import Any

from agentbatch.protocols.children import die_with_parent


class _DyingChildren:
    """The `subprocess` module, except that `Popen` children die with this process."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args: Any, **kwargs: Any) -> subprocess.Popen[Any]:  # noqa: N802 - the module's name
        if kwargs.get("preexec_fn") is None and (preexec := die_with_parent()) is not None:
            kwargs["preexec_fn"] = preexec
        return subprocess.Popen(*args, **kwargs)


def guard_prefect_server() -> None:
    """Make the temporary Prefect server of this process die with it (idempotent; nothing to do when
    a Prefect API is configured: then no server is started here)."""
    from prefect.settings import get_current_settings

    if get_current_settings().api.url:
        return
    from prefect.server.api import server as prefect_server

    if not isinstance(prefect_server.subprocess, _DyingChildren):
        prefect_server.subprocess = _DyingChildren()  # type: ignore[assignment]  # the module's subprocess, wrapped
