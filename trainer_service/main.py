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
        from trainer_service.backends.base import exit_rank

        exit_rank(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
