"""Child processes that die with their parent, also when the parent is killed with SIGKILL.

`die_with_parent()` returns a `preexec_fn` for `subprocess.Popen`: in the child, between fork and
exec, it asks Linux (prctl PR_SET_PDEATHSIG) to send SIGKILL to the child when its parent goes away,
and exits at once if the parent is already gone. Without it a server started by a run (Prefect's
temporary API server, a simulated engine) outlives a killed run as an orphan.

Linux delivers the signal when the *thread* that forked the child ends, so use it from threads that
live as long as the process (the main thread, or a long-lived worker thread); elsewhere it is a no-op.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn tying the child's life to this process (None where that is not possible)."""
    if sys.platform != "linux" or threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork: the child only calls it

    def _preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return _preexec
