"""Ending a process when the process that started it dies (Linux `prctl(PR_SET_PDEATHSIG)`).

Without it a SIGKILLed parent leaves its children running, holding their ports and the run's files:
- the embedded nats-server gets SIGKILL when the process that started it dies (`parent_death_preexec`,
  set between fork and exec);
- torchrun's ranks get SIGKILL when torchrun dies (`die_with_parent`);
- every child of `jetrl up` / `jetrl demo` gets SIGTERM, so it stops as it does on Ctrl-C, when the
  supervisor dies (`die_with_supervisor`; the supervisor marks its children with JETRL_SUPERVISOR_PID).

Where there is no such call (not Linux with glibc) these do nothing: the child outlives its parent.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
SUPERVISOR_ENV = "JETRL_SUPERVISOR_PID"  # set by launcher/supervisor.py in each child's environment


def _prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """This process gets `sig` when its parent dies; False where that cannot be arranged."""
    prctl = _prctl()
    return prctl is not None and prctl(PR_SET_PDEATHSIG, int(sig)) == 0


def parent_death_preexec(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A preexec_fn that makes the forked child get `sig` when its parent dies, or None where there is no
    such call. libc is resolved here, in the parent, so the child between fork and exec only makes the one
    foreign call."""
    prctl = _prctl()
    if prctl is None:
        return None
    return lambda: prctl(PR_SET_PDEATHSIG, int(sig))


def die_with_supervisor(sig: int = signal.SIGTERM) -> None:
    """In a child of jetrl's supervisor: get `sig` when the supervisor dies. The mark is taken out of
    os.environ, so this process's own children (torchrun's ranks, an engine server) do not take the
    supervisor for their parent. A supervisor that died before this call is noticed here too (the
    signal would never come), and `sig` is sent at once."""
    mark = os.environ.pop(SUPERVISOR_ENV, "")
    if not mark.isdigit() or not die_with_parent(sig):
        return
    if os.getppid() != int(mark):
        os.kill(os.getpid(), sig)
