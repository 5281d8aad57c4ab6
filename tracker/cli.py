"""`jetrl track -c CONFIG --to tensorboard|wandb|trackio`: the experiment-tracker sink."""

from __future__ import annotations

import typer

from shared.runtime.cliutil import CONFIG_OPTION, OVERRIDES_ARG, load_or_exit, run_async


def track_cmd(
    config: str = CONFIG_OPTION,
    to: str = typer.Option("", "--to", help="tensorboard, wandb or trackio ('' = tracking.to of the config)."),
    dir: str = typer.Option("", "--dir", help="Where the tracker writes ('' = tracking.dir, else ./jetrl-tracking)."),
    until_idle: float = typer.Option(0.0, "--until-idle", min=0.0,
                                     help="Exit after this many seconds without a message (0 = run until Ctrl-C): "
                                          "export a finished run's retained events and trajectories."),
    overrides: list[str] = OVERRIDES_ARG,
) -> None:
    """Write the run's scalars (docs/tracking.md) to a tracker, reading only the bus: trainer steps and
    stage timings, evaluations, rollout metrics and weight loads from EVENTS, reward and length
    statistics per version from TRAJECTORIES."""
    import asyncio
    import os
    import signal
    from pathlib import Path

    from shared.runtime.telemetry import setup_logging, start_metrics
    from tracker.sink import TrackerSink
    from tracker.writers import WRITERS

    ov = list(overrides or [])
    if to:
        ov.append(f"tracking.to={to}")
    cfg = load_or_exit(config, ov)
    setup_logging(cfg.telemetry, "track")
    t = cfg.tracking
    niceness = os.nice(t.nice) if hasattr(os, "nice") else 0  # os.nice returns the new niceness
    out = Path(dir or t.dir or "jetrl-tracking")
    try:
        writer = WRITERS[t.to](out, cfg.run, project=t.project, name=t.name, mode=t.wandb_mode,
                               config={"run": cfg.run, "schedule": cfg.schedule.model_dump()})
    except ImportError as exc:
        typer.secho(f"jetrl track --to {t.to}: {exc.name or exc} is not installed (pip install 'jetrl[tracking]')",
                    fg="red", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"tracking run {cfg.run} to {t.to} at {writer.path} (nice {niceness})")
    sink = TrackerSink(cfg, writer)
    if cfg.telemetry.metrics_port >= 0:
        start_metrics(cfg.telemetry, sink.registry)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await sink.run(stop, until_idle_s=until_idle)

    run_async(main())


def register(app: typer.Typer) -> None:
    app.command("track")(track_cmd)
