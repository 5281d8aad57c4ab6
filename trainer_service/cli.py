"""`jetrl trainer -c CONFIG [--resume] [overrides]`."""

from __future__ import annotations

import os
import sys

import typer

from shared.cliutil import CONFIG_OPTION, OVERRIDES_ARG, load_or_exit


def torchrun_argv(nproc: int, config: str | None, resume: bool, overrides: list[str]) -> list[str]:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "trainer_service.main"]
    if config:
        argv += ["-c", config]
    if resume:
        argv.append("--resume")
    return argv + list(overrides)


def register(app: typer.Typer) -> None:
    @app.command("trainer")
    def trainer(
        config: str = CONFIG_OPTION,
        resume: bool = typer.Option(False, "--resume", help="Continue from the latest checkpoint of the run."),
        overrides: list[str] = OVERRIDES_ARG,
    ) -> None:
        """Train on the run's trajectory groups and publish every new policy version."""
        cfg = load_or_exit(config, overrides)
        if cfg.trainer.nproc > 1 and "WORLD_SIZE" not in os.environ:
            argv = torchrun_argv(cfg.trainer.nproc, config, resume, overrides or [])
            os.execv(argv[0], argv)
        from trainer_service.main import main

        args = (["-c", config] if config else []) + (["--resume"] if resume else []) + list(overrides or [])
        raise typer.Exit(main(args))
