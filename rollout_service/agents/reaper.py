"""`python -m rollout_service.agents.reaper WORKER_PID CMD...`: run a command agent so it dies with its worker.

A command agent runs in a session (and process group) of its own, so that a timed-out episode can kill it
and everything it started with one `killpg`. A rollout worker that is SIGKILLed cannot do that, and the
agent would reparent to pid 1 and run on. This wrapper is that session's leader: it gets SIGTERM when the
worker dies (PR_SET_PDEATHSIG, shared/runtime/parent_death.py), runs CMD as its child in its own process group
(CMD's own children included, unless they start sessions of their own), and on SIGTERM, SIGINT or the
worker's death kills the whole group, itself last. Otherwise it exits with CMD's exit status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from shared.runtime.parent_death import die_with_parent


def _kill_group(*_: object) -> None:
    os.killpg(os.getpgrp(), signal.SIGKILL)  # CMD, its children, and this process


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python -m rollout_service.agents.reaper WORKER_PID CMD [ARG...]", file=sys.stderr)
        return 2
    worker, cmd = int(argv[0]), argv[1:]
    if os.getpgrp() != os.getpid():  # started without a session of its own: make a group, never kill the caller's
        os.setpgid(0, 0)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _kill_group)
    die_with_parent(signal.SIGTERM)
    if os.getppid() != worker:  # the worker died before the parent-death signal was set
        _kill_group()
    try:
        child = subprocess.Popen(cmd)  # stdin / stdout / stderr are the worker's pipes, passed on
    except OSError as exc:
        print(f"agent command {cmd[0]!r} could not start: {exc}", file=sys.stderr)
        return 127
    rc = child.wait()
    return 128 - rc if rc < 0 else rc  # killed by a signal: the shell's convention


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
