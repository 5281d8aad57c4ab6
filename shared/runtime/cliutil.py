"""Helpers for `jetrl` subcommands: config loading with readable errors, running a coroutine."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import typer

from shared.config import ConfigError, JetrlConfig, load_config

CONFIG_OPTION = typer.Option(None, "--config", "-c", help="Run config YAML (defaults are used without one).")
OVERRIDES_ARG = typer.Argument(None, help="Overrides as a.b.c=value, e.g. trainer.lr=3e-4", show_default=False)


def load_or_exit(config: str | None, overrides: list[str] | None, model: type = JetrlConfig) -> Any:
    """Load the config or exit with code 2 and a message naming the file, field and reason."""
    try:
        return load_config(model, config, overrides or [])
    except (ConfigError, ValueError) as exc:
        typer.secho(f"config error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None


def run_async(coro) -> Any:
    """Run a service's main coroutine; Ctrl-C stops it without a traceback."""
    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise typer.Exit(130) from None
