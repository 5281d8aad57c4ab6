"""`jetrl weights ...`: run the weight store service and look into it."""

from __future__ import annotations

import json

import typer

from shared.runtime.cliutil import CONFIG_OPTION, OVERRIDES_ARG, load_or_exit, run_async

weights_app = typer.Typer(help="The weight store: versioned model weights over HTTP and a shared filesystem.",
                          no_args_is_help=True)


@weights_app.command("serve")
def serve_cmd(config: str = CONFIG_OPTION, overrides: list[str] = OVERRIDES_ARG) -> None:
    """Serve `weights.root` over HTTP on weights.host:weights.port until Ctrl-C / SIGTERM."""
    from shared.runtime.auth import AuthConfigError
    from shared.runtime.credentials import SecretFileError
    from shared.runtime.telemetry import setup_logging
    from weight_store.server import serve

    cfg = load_or_exit(config, overrides)
    setup_logging(cfg.telemetry, "weights")
    try:
        run_async(serve(cfg.weights, cfg.telemetry.log_level))
    except (AuthConfigError, SecretFileError) as exc:
        typer.secho(f"config error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None


@weights_app.command("ls")
def ls_cmd(config: str = CONFIG_OPTION, overrides: list[str] = OVERRIDES_ARG) -> None:
    """List the run's versions (run = the config's `run`) on the store at weights.url."""
    from weight_store.client import WeightStoreClient, WeightStoreError

    cfg = load_or_exit(config, overrides)

    async def go() -> None:
        client = WeightStoreClient(cfg.weights)
        try:
            vs = await client.versions(cfg.run)
            typer.echo(json.dumps({"run": cfg.run, "versions": vs}))
        except (WeightStoreError, OSError) as exc:
            typer.secho(f"weight store {cfg.weights.url}: {exc}", fg="red", err=True)
            raise typer.Exit(1) from None

    run_async(go())


@weights_app.command("manifest")
def manifest_cmd(version: int = typer.Argument(..., help="Version of the config's run."),
                 config: str = CONFIG_OPTION, overrides: list[str] = OVERRIDES_ARG) -> None:
    """Print the manifest of one version."""
    from weight_store.client import WeightStoreClient, WeightStoreError

    cfg = load_or_exit(config, overrides)

    async def go() -> None:
        try:
            typer.echo(json.dumps(await WeightStoreClient(cfg.weights).manifest(cfg.run, version), indent=1))
        except (WeightStoreError, OSError) as exc:
            typer.secho(f"weight store {cfg.weights.url}: {exc}", fg="red", err=True)
            raise typer.Exit(1) from None

    run_async(go())


@weights_app.command("fetch")
def fetch_cmd(version: int = typer.Argument(..., help="Version of the config's run."),
              serve_s: float = typer.Option(0.0, "--serve-s", help="With weights.fanout=relay: keep serving "
                                            "the version's pieces to other hosts for this many seconds."),
              config: str = CONFIG_OPTION, overrides: list[str] = OVERRIDES_ARG) -> None:
    """Fetch one version onto this host (weights.cache_dir), checked against its manifest, as a rollout
    worker does (delta, relay fan-out and shared filesystem per the config); prints the path and what it
    cost. Prefetches a version onto a new host, and is how the relay is tested across hosts."""
    import asyncio
    import time

    from weight_store.client import WeightStoreClient, WeightStoreError

    cfg = load_or_exit(config, overrides)

    async def go() -> None:
        client = WeightStoreClient(cfg.weights)
        try:
            t0 = time.perf_counter()
            path = await client.fetch(cfg.run, version)
            out = {"run": cfg.run, "version": version, "path": str(path),
                   "seconds": round(time.perf_counter() - t0, 3), **client.stats}
            if client.relay is not None:
                out.update(relay=client.relay.url, **client.relay.stats)
            typer.echo(json.dumps(out), nl=True)
            if serve_s > 0 and client.relay is not None:
                await asyncio.sleep(serve_s)
                typer.echo(json.dumps({"served": client.relay.stats}))
        except (WeightStoreError, OSError) as exc:
            typer.secho(f"fetch of version {version} of run {cfg.run}: {exc}", fg="red", err=True)
            raise typer.Exit(1) from None
        finally:
            await client.close()

    run_async(go())


@weights_app.command("export")
def export_cmd(version: int = typer.Argument(..., help="Version of the config's run."),
               out: str = typer.Option(..., "--out", "-o", help="Directory to write (must be absent or empty)."),
               merge: bool = typer.Option(False, "--merge", help="LoRA version: merge the adapter into the base "
                                          "model (model.*) and write a Hugging Face model dir."),
               config: str = CONFIG_OPTION, overrides: list[str] = OVERRIDES_ARG) -> None:
    """Write one version to a directory: a full model as is; a LoRA adapter as its PEFT dir, or with
    --merge merged into the run's base model (a plain HF model dir for deployment)."""
    from shared.model.adapters import BaseMismatch
    from weight_store.client import WeightStoreError
    from weight_store.export import export_version

    cfg = load_or_exit(config, overrides)

    async def go() -> None:
        try:
            typer.echo(json.dumps(await export_version(cfg, version, out, merge)))
        except (WeightStoreError, OSError, BaseMismatch) as exc:
            typer.secho(f"export of version {version} of run {cfg.run}: {exc}", fg="red", err=True)
            raise typer.Exit(1) from None

    run_async(go())


def register(app: typer.Typer) -> None:
    app.add_typer(weights_app, name="weights")
