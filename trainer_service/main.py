"""`python -m trainer_service.main -c CONFIG [--resume] [overrides]`: what every rank runs.

`jetrl trainer` calls this directly for one process, or re-launches it under torchrun for several.
"""

from __future__ import annotations

import argparse
import os
import sys

from shared.runtime.parent_death import die_with_parent


def main(argv: list[str] | None = None) -> int:
    from shared.config import ConfigError, JetrlConfig, load_config
    from shared.runtime.telemetry import setup_logging

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
        die_with_parent()  # a SIGKILLed torchrun takes this rank down too
    setup_logging(cfg.telemetry, f"trainer[{os.environ.get('RANK', '0')}]")
    from trainer_service.service import run

    run(cfg, resume=args.resume)
    if "LOCAL_RANK" in os.environ:
        from trainer_service.backends.base import exit_rank

        exit_rank(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
