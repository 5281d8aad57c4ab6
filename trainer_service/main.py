"""`python -m trainer_service.main -c CONFIG [--resume] [overrides]`: what every rank runs.

`jetrl trainer` calls this directly for one process, or re-launches it under torchrun for several.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys


def _die_with_parent() -> None:
    """Under torchrun: if the launcher is SIGKILLed, take this rank down too (Linux prctl)."""
    try:
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _exit_without_finalizing(code: int) -> None:
    """Under torchrun, leave without Python's interpreter shutdown. A gloo worker thread may still be
    destroying the last collective's work when the main thread finalizes the interpreter; its tensors
    then decref Python objects, the thread is ended while taking the GIL, and the process aborts with
    "terminate called without an active exception" (seen on one run in ~4 of a 2-node trainer test; the
    peer node's torchrun then waits 300 s at its exit barrier). Everything the run wrote is flushed first."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    from shared.config import ConfigError, JetrlConfig, load_config
    from shared.telemetry import setup_logging

    p = argparse.ArgumentParser(prog="jetrl trainer")
    p.add_argument("-c", "--config", default=None)
    p.add_argument("--resume", action="store_true")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    try:
        cfg = load_config(JetrlConfig, args.config, args.overrides)
    except (ConfigError, ValueError) as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    if "LOCAL_RANK" in os.environ:
        _die_with_parent()
    setup_logging(cfg.telemetry, f"trainer[{os.environ.get('RANK', '0')}]")
    from trainer_service.service import run

    run(cfg, resume=args.resume)
    if "LOCAL_RANK" in os.environ:
        _exit_without_finalizing(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
