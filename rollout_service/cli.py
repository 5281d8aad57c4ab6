"""`jetrl rollout -c CONFIG [overrides] [--workers K]`: one rollout worker, or K in one process (start as many as you like)."""

from __future__ import annotations

import typer

from shared.runtime.cliutil import CONFIG_OPTION, OVERRIDES_ARG, load_or_exit, run_async


def rollout_cmd(
    config: str = CONFIG_OPTION,
    overrides: list[str] = OVERRIDES_ARG,
    worker: str = typer.Option("", "--worker", help="Worker id in events and groups ('' = host-pid-random); "
                               "with several workers, each is <id>-<i>."),
    workers: int = typer.Option(0, "--workers", min=0, max=1024,
                                help="Workers in this process (0 = rollout.service.workers_per_process)."),
) -> None:
    """Run a rollout worker: prompts -> workflow -> trajectory groups, following weight announcements."""
    cfg = load_or_exit(config, overrides)
    from rollout_service.service import serve
    from rollout_service.tools import build_tools
    from rollout_service.workflows import WorkflowLoadError, load_workflow
    from shared.runtime.telemetry import setup_logging

    setup_logging(cfg.telemetry, "rollout")
    try:  # fail at start-up, before connecting or loading a model, on a bad workflow or tool config
        load_workflow(cfg.rollout.workflow, cfg.rollout.workflow_args)
        tools = build_tools(cfg.rollout.tools)  # the worker (or pool) starts rollout.tools.mcp's servers into it
    except (WorkflowLoadError, ValueError) as exc:
        typer.secho(f"config error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    count = workers or cfg.rollout.service.workers_per_process
    if count > 1:
        from rollout_service.pool import serve_pool

        run_async(serve_pool(cfg, count, tools=tools, instance=worker or None))
    else:
        run_async(serve(cfg, tools=tools, instance=worker or None))


def serve_policy_cmd(
    config: str = CONFIG_OPTION,
    overrides: list[str] = OVERRIDES_ARG,
    worker: str = typer.Option("", "--worker", help="Worker id in events and groups ('' = host-pid-random)."),
) -> None:
    """Serve the current policy to outside traffic in sessions rewarded later (online training,
    docs/environments.md): rollout.online.* and the rollout.agent endpoint's host, port and bounds."""
    cfg = load_or_exit(config, overrides)
    from rollout_service.online.keys import ClientKeys
    from rollout_service.service import serve
    from shared.runtime.telemetry import setup_logging

    setup_logging(cfg.telemetry, "rollout")
    try:
        if not cfg.rollout.online.keys_dir:
            raise ValueError("rollout.online.keys_dir is not set: a directory of <app>.key files (mode 0600)")
        ClientKeys(cfg.rollout.online.keys_dir)
    except ValueError as exc:
        typer.secho(f"config error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    run_async(serve(cfg, instance=worker or None, online=True))


def register(app: typer.Typer) -> None:
    app.command("rollout")(rollout_cmd)
    app.command("serve-policy")(serve_policy_cmd)
