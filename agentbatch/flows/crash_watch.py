"""A batch's Prefect flow run does not stay Running when the process driving it dies.

The driving process starts a small watcher (`CrashWatch.start`) in a session of its own, with the
read end of a pipe as its stdin, and keeps the write end. However that process ends, SIGKILL
included, the kernel closes the write end and the watcher reads end-of-file at once. If the process
did not say `stop` first and the batch is still `running` in the store, the watcher sets the flow
run to Crashed. `agentbatch status` does the same when it sees the batch crashed (whoever
notices first; a flow run already final is left as it is).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass


def mark_prefect_crashed(flow_run_id: str | None, message: str) -> str | None:
    """Set the batch's Prefect flow run to Crashed (when a Prefect API is reachable); what happened."""
    if not flow_run_id:
        return None
    from agentbatch.flows.prefect_server import choose_api

    if choose_api(start=False).url is None:
        return "Prefect flow run not updated: no Prefect server is running"
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    async def mark() -> str:
        async with get_client() as client:
            run = await client.read_flow_run(UUID(flow_run_id))
            if run.state is not None and run.state.is_final():
                return f"Prefect flow run {run.name} is {run.state.name}"
            await client.set_flow_run_state(flow_run_id, Crashed(message=message), force=True)
            return f"Prefect flow run {run.name} marked Crashed"

    try:
        return asyncio.run(mark())
    except Exception as exc:  # noqa: BLE001 - the store is the source of truth; Prefect is a view
        return f"Prefect flow run not updated: {exc.__class__.__name__}: {exc}"


STOPPED = b"stopped"  # what `stop()` writes: the run ended in its process; no byte: the process died


@dataclass
class CrashWatch:
    """The watcher of one batch's flow run in this process; `stop()` when the batch's run ends."""

    proc: subprocess.Popen[bytes] | None

    @classmethod
    def start(cls, db_url: str, batch_id: int, flow_run_id: str | None) -> CrashWatch:
        if not flow_run_id:
            return cls(None)
        env = {**os.environ, "AGENTBATCH_DB_URL": db_url}  # not in argv: a password would show in `ps`
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentbatch.flows.crash_watch", str(batch_id), flow_run_id, str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, start_new_session=True,
        )
        return cls(proc)

    def stop(self) -> None:
        """The run ended here (normally or by an exception): the watcher exits without a word."""
        if self.proc is not None and self.proc.stdin is not None:
            with contextlib.suppress(OSError):  # a watcher that is gone has nothing to be told
                self.proc.stdin.write(STOPPED)
            with contextlib.suppress(OSError):
                self.proc.stdin.close()  # not waited for: it exits at once, reaped by the next Popen
            self.proc = None


@contextlib.contextmanager
def watching(db_url: str, batch_id: int, flow_run_id: str | None) -> Iterator[CrashWatch]:
    """A `CrashWatch` for the duration of the block (none without a flow run)."""
    watch = CrashWatch.start(db_url, batch_id, flow_run_id)
    try:
        yield watch
    finally:
        watch.stop()


def main(argv: list[str]) -> int:
    batch_id, flow_run_id, parent = int(argv[0]), argv[1], int(argv[2])
    # Returns when the driving process closes the pipe or dies; a dead process (a zombie its parent has
    # not reaped still answers kill -0) never wrote STOPPED.
    if sys.stdin.buffer.read() == STOPPED:
        return 0  # `stop()`: the run ended in that process, which records its own outcome
    from agentbatch.db.store import Store

    store = Store(read_only=True)  # AGENTBATCH_DB_URL
    try:
        batch = store.get_batch(batch_id)
        still_running = batch is not None and batch.status == "running"
    finally:
        store.close()
    if still_running:
        note = mark_prefect_crashed(flow_run_id, f"the process driving batch {batch_id} (pid {parent}) died; "
                                                 f"continue with: agentbatch resume {batch_id}")
        print(note, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
