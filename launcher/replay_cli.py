"""`jetrl replay`: train a fresh trainer on what a run recorded (trainer_service/replay.py), reading the
recording from a live NATS server (the config's `nats.*`: a user that may read the TRAJECTORIES and EVENTS
streams, e.g. jetrl-tracker or jetrl-admin) or from a stopped `jetrl up` / `jetrl demo` run dir
(`--run-dir`: its JetStream store is served by a private nats-server on a free port while it is read, with
the run's own admin credentials).

    jetrl replay --run-dir jetrl-demo/runs/demo-... --out replay-gspo trainer.algorithm.objective=gspo
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import typer

from shared.runtime.cliutil import OVERRIDES_ARG, load_or_exit


@contextlib.asynccontextmanager
async def recorded_bus(cfg, run_dir: Path | None):
    """A JetStream context on the recording: the run dir's store served privately, or the config's NATS."""
    from shared.config.nats import NatsConfig
    from shared.contract import bus
    from shared.runtime.natsd import EmbeddedNats, read_users

    server = None
    ncfg = cfg.nats
    if run_dir is not None:
        store, users_dir = run_dir / "nats", run_dir / "secrets" / "nats"
        if not (store / "jetstream").is_dir():
            raise typer.BadParameter(f"{run_dir}: no JetStream store under {store} (is it a `jetrl up` run dir?)")
        users = read_users(users_dir) if users_dir.is_dir() else {}
        server = EmbeddedNats(store_dir=store, users=users, max_payload=cfg.nats.max_payload)
        await asyncio.to_thread(server.start)
        ncfg = NatsConfig(servers=[server.url], user="jetrl-admin" if users else "",
                          password_file=str(users_dir / "admin.password") if users else "",
                          insecure_no_auth=not users)
    nc = await bus.connect(ncfg, name="jetrl-replay")
    try:
        yield nc.jetstream()
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
        if server is not None:
            await asyncio.to_thread(server.stop)


async def load(cfg, run: str, run_dir: Path | None):
    from trainer_service.replay import read_recording

    async with recorded_bus(cfg, run_dir) as js:
        return await read_recording(js, run, cfg.trainer.publish_every)


def replay_cmd(
    run: str = typer.Option("", "--run", help="The recorded run (default: the config's run)."),
    run_dir: Path = typer.Option(None, "--run-dir", help="A stopped `jetrl up` / `jetrl demo` run dir to read the "
                                 "recording from (default: the live NATS of the config)."),
    config: str = typer.Option("", "--config", "-c", help="The replay's config: the trainer to train (default: the "
                               "run dir's config.yaml, i.e. the original run's)."),
    overrides: list[str] = OVERRIDES_ARG,
    out: Path = typer.Option(Path("jetrl-replay"), "--out", help="Where steps.jsonl (and saved weights) go."),
    steps: int = typer.Option(0, min=0, help="Replay only the first N recorded steps (0 = all)."),
    save_every: int = typer.Option(0, min=0, help="Save the weights every N steps as out/versions/<step> (0 = never)."),
) -> None:
    """Train a fresh trainer on the trajectories a run recorded, with this config's objective, correction,
    learning rate or staleness filter, without generating again."""
    from trainer_service.replay import replay

    if not config and run_dir is None:
        typer.secho("give the replay's config (-c) or a recorded run dir (--run-dir)", fg="red", err=True)
        raise typer.Exit(2)
    cfg = load_or_exit(config or str(run_dir / "config.yaml"), overrides)
    run = run or cfg.run
    rec = asyncio.run(load(cfg, run, run_dir.resolve() if run_dir else None))
    if not rec.steps:
        typer.secho(f"run {run!r}: no trained steps recorded (the trainer's `groups` events); nothing to replay",
                    fg="red", err=True)
        raise typer.Exit(1)
    typer.echo(f"run {run}: {len(rec.groups)} recorded groups, {len(rec.steps)} trained steps"
               + (f", {rec.undecodable} undecodable messages skipped" if rec.undecodable else ""))

    def show(r: dict) -> None:
        typer.echo(f"step {r['step']:5d}  version {r['version']:5d}  groups {r['groups']:4d}  samples {r['samples']:5d}"
                   f"  loss {r.get('loss', float('nan')):+.6f}  missing {r['missing']}  stale {r['dropped_stale']}")

    records = replay(cfg, rec, out=out, steps=steps, save_every=save_every, on_step=show)
    missing = sum(r["missing"] for r in records)
    typer.echo(f"replayed {len(records)} steps into {out}/steps.jsonl" +
               (f"; {missing} recorded groups were no longer in the stream (retention)" if missing else ""))


def register(app: typer.Typer) -> None:
    app.command("replay")(replay_cmd)
