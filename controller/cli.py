"""`jetrl controller` (the service), and `jetrl enqueue` / `jetrl status` (thin clients of its REST API)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from shared.runtime.cliutil import CONFIG_OPTION, OVERRIDES_ARG, load_or_exit, run_async


def controller_cmd(config: str = CONFIG_OPTION, overrides: list[str] = OVERRIDES_ARG) -> None:
    """Run the controller: REST API + dashboard, SQL ledger, admission-controlled prompt release."""
    cfg = load_or_exit(config, overrides)
    run_async(_serve(cfg))


def _server_class():
    import contextlib

    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn re-raises a captured SIGTERM/SIGINT once it has shut down, which ends the process before
        any `finally` runs (the embedded nats-server was left running, orphaned). Here the signal only stops
        the server; _serve then stops what it started and returns."""

        @contextlib.contextmanager
        def capture_signals(self):
            with super().capture_signals():
                yield
                self._captured_signals.clear()

    return Server


async def _serve(cfg) -> None:
    import uvicorn

    from controller.api import make_app
    from controller.service import Controller
    from shared.runtime.auth import AuthConfigError
    from shared.runtime.credentials import SecretFileError
    from shared.runtime.telemetry import setup_logging

    setup_logging(cfg.telemetry, "controller")
    srv = None
    try:
        if cfg.nats.embedded:
            from shared.runtime.natsd import embedded_from_config

            # die_with_parent: a SIGKILLed controller takes its server along (Linux)
            srv = embedded_from_config(cfg.nats, die_with_parent=True).start()
            cfg.nats.servers = [srv.url]
        try:
            ctl = Controller(cfg)
        except Exception as exc:
            typer.secho(f"controller: cannot open database {cfg.controller.db_url!r}: {exc}", fg="red", err=True)
            raise typer.Exit(2) from None
        try:
            app = make_app(ctl)
        except (AuthConfigError, SecretFileError) as exc:
            typer.secho(f"config error: {exc}", fg="red", err=True)
            raise typer.Exit(2) from None
        server = _server_class()(uvicorn.Config(app, host=cfg.controller.host, port=cfg.controller.port,
                                                log_level=cfg.telemetry.log_level.lower(), access_log=False))
        await server.serve()
    except (AuthConfigError, SecretFileError) as exc:
        typer.secho(f"config error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    finally:
        if srv is not None:
            srv.stop()


def _config_token(cfg) -> str:
    from shared.runtime.credentials import SecretFileError

    try:
        return cfg.controller.secret("token")
    except SecretFileError as exc:
        typer.secho(f"config error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None


def _client(url: str, token: str):
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=600.0)


def _check(resp) -> dict:
    if resp.status_code >= 400:
        try:
            body = resp.json()
            msg = body.get("detail", resp.text)
            errs = body.get("errors") or []
        except ValueError:
            msg, errs = resp.text, []
        typer.secho(f"error {resp.status_code}: {msg}", fg="red", err=True)
        for e in errs[:10]:
            where = e.get("where") or e.get("field") or ""
            typer.secho(f"  {where}: {e.get('error')}", fg="red", err=True)
        raise typer.Exit(1)
    return resp.json()


def _mapping(items: list[str] | None) -> dict:
    out: dict = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or key not in ("prompt", "messages", "reference", "metadata"):
            typer.secho(f"--map {item!r}: use prompt=COL, messages=COL, reference=COL or metadata=A,B", fg="red", err=True)
            raise typer.Exit(2)
        out[key] = [v for v in value.split(",") if v] if key == "metadata" else value
    return out


def enqueue_cmd(
    source: str = typer.Argument(..., help="A JSONL/Parquet file, or hf:NAME (a Hugging Face dataset)."),
    run: str = typer.Option(..., "--run", "-r", help="Run id to enqueue into."),
    epochs: int = typer.Option(1, min=1, help="Passes over the dataset."),
    seed: int | None = typer.Option(None, "--seed", help="Shuffle seed (default: file order)."),
    limit: int | None = typer.Option(None, min=1, help="Use only the first N rows."),
    split: str = typer.Option("train", help="hf: split."),
    subset: str | None = typer.Option(None, help="hf: dataset config name."),
    data_files: list[str] = typer.Option(None, "--data-files", help="hf: data files (with hf:json / hf:parquet)."),
    map_: list[str] = typer.Option(None, "--map", help="Field mapping, e.g. --map prompt=question --map reference=answer"),
    create: str | None = typer.Option(None, "--create", help="Create the run from this config file if it is missing."),
    url: str = typer.Option("", help="Controller URL (default: controller.url of the config)."),
    token: str = typer.Option("", envvar="JETRL_TOKEN", help="Bearer token (default: controller.token[_file])."),
    config: str = CONFIG_OPTION,
) -> None:
    """Register a dataset with the controller and enqueue it into a run."""
    cfg = load_or_exit(config, [])
    mapping = _mapping(map_)
    with _client(url or cfg.controller.url, token or _config_token(cfg)) as c:
        if create:
            text = Path(create).read_text()
            out = _check(c.post("/v1/runs", content=text.encode(), headers={"Content-Type": "application/yaml"}))
            typer.echo(f"run {out['id']}: {'created' if out.get('created') else 'exists'}")
        if source.startswith("hf:"):
            body = {"name": source[3:], "split": split, "subset": subset, "mapping": mapping,
                    "data_files": [str(Path(f).resolve()) for f in data_files] if data_files else None}
            d = _check(c.post("/v1/datasets/hf", json=body))
        else:
            p = Path(source)
            if not p.is_file():
                typer.secho(f"{source}: no such file (use hf:NAME for a Hugging Face dataset)", fg="red", err=True)
                raise typer.Exit(2)
            with open(p, "rb") as f:
                d = _check(c.post("/v1/datasets", files={"file": (p.name, f)},
                                  data={"mapping": json.dumps(mapping)} if mapping else {}))
        typer.echo(f"dataset {d['id']} {d['name']}: {d['num_rows']} rows, sha256 {d['content_hash'][:12]} "
                   f"({'new' if d.get('created') else 'already registered'})")
        e = _check(c.post(f"/v1/runs/{run}/enqueues", json={"dataset": str(d["id"]), "epochs": epochs,
                                                             "shuffle_seed": seed, "limit": limit}))
        typer.echo(f"enqueue {e['id']} into {run}: {e['total']} prompts (epochs {e['first_epoch']}.."
                   f"{e['first_epoch'] + e['epochs'] - 1}){'' if e.get('created') else ', already enqueued'}")


def status_cmd(
    run: str = typer.Argument(None, help="Run id (default: every run)."),
    url: str = typer.Option("", help="Controller URL (default: controller.url of the config)."),
    as_json: bool = typer.Option(False, "--json", help="Print the raw JSON."),
    token: str = typer.Option("", envvar="JETRL_TOKEN", help="Bearer token (default: controller.token[_file])."),
    config: str = CONFIG_OPTION,
) -> None:
    """Show runs: status, weight version, admission bound, the prompt ledger, and a warning while the
    trainer reports no learning signal."""
    cfg = load_or_exit(config, [])
    with _client(url or cfg.controller.url, token or _config_token(cfg)) as c:
        runs = [_check(c.get(f"/v1/runs/{run}"))] if run else _check(c.get("/v1/runs"))
        health = _check(c.get("/v1/health"))
    if as_json:
        typer.echo(json.dumps({"runs": runs, "health": health}, indent=2))
        return
    typer.echo(f"controller: {health['status']} (nats {health['nats']}, database {health['database']})")
    if not runs:
        typer.echo("no runs")
    for r in runs:
        lg = r["ledger"]
        typer.echo(f"{r['id']}: {r['status']}, version {r['current_version']}, bound {r['admission_bound']} "
                   f"(max_staleness {r['max_staleness']}, batch {r['batch_size']})")
        typer.echo(f"  enqueued {r['enqueued']}  released {lg['released']}  in flight {lg['in_flight']}  "
                   f"trained {lg['trained']}  dropped stale {lg['dropped_stale']}  filtered {lg['filtered']}  "
                   f"dead-lettered {lg['dead_lettered']}")
        sig = r.get("signal") or {}
        if sig.get("no_signal"):
            typer.secho(f"  WARNING: no learning signal since step {sig.get('since_step')} (step {sig.get('step')}): "
                        f"{sig.get('message') or 'the trainer is training only zero-advantage groups'}", fg="yellow")
    for s in health["services"]:
        if run is None or s["run"] == run:
            typer.echo(f"  {s['run']}/{s['service']} {s['instance']}: {s['status'] if s['alive'] else 'silent'} "
                       f"({s['age_s']:.0f} s ago)")


def why_cmd(
    run: str = typer.Argument(None, help="Run id (default: the config's run)."),
    url: str = typer.Option("", help="Controller URL (default: controller.url of the config)."),
    as_json: bool = typer.Option(False, "--json", help="Print the diagnosis (and its evidence) as JSON."),
    token: str = typer.Option("", envvar="JETRL_TOKEN", help="Bearer token (default: controller.token[_file])."),
    config: str = CONFIG_OPTION,
) -> None:
    """Say why a run is not advancing, or that it is, and what to do (GET /v1/runs/{run}/diagnosis).
    Exit code 0 when the run advances, is starting or is complete; 1 when it is stalled or paused."""
    # the evidence quotes services' error texts: printed without control characters
    from controller.no_signal import printable

    cfg = load_or_exit(config, [])
    run = run or cfg.run
    import httpx

    url = url or cfg.controller.url
    try:
        with _client(url, token or _config_token(cfg)) as c:
            d = _check(c.get(f"/v1/runs/{run}/diagnosis", params={"evidence": as_json}))
    except httpx.HTTPError as exc:
        typer.secho(f"cannot reach the controller at {url}: {type(exc).__name__}: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(d, indent=2, default=str))
    else:
        typer.echo(f"{run}: {printable(d['summary'])}")
        for f in d["findings"]:
            color = {"error": "red", "warning": "yellow"}.get(f["severity"])
            typer.secho(f"  [{f['cause']}] {printable(f['summary'])}", fg=color)
            typer.echo(f"      what to do: {printable(f['action'])}")
    if d["state"] in ("stalled", "paused"):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("controller")(controller_cmd)
    app.command("enqueue")(enqueue_cmd)
    app.command("status")(status_cmd)
    app.command("why")(why_cmd)
