"""What `jetrl up` will start, before anything starts: the resolved config (free ports, state paths inside
the run dir, secrets and NATS users written as 0600 files), each child's config and command line (plan),
and the `--dry-run` text. launcher/up.py starts what this plans."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from launcher.metrics_ports import assign_metrics_ports, local_host
from launcher.supervisor import ProcessSpec
from shared.config import JetrlConfig, dump_config
from shared.runtime.credentials import write_private
from shared.runtime.natsd import free_port

CHILD = [sys.executable, "-m", "launcher.cli"]


@dataclass
class UpOptions:
    run_dir: Path
    workers: int = 1  # rollout workers
    online: bool = False  # also `jetrl serve-policy`: the policy served to outside traffic (rollout.online)
    reward_replicas: int = 1
    with_eval: bool = True  # start the eval follower when the config asks for one
    eval_dataset: str = ""  # override eval.dataset for the follower
    eval_every: int = 0  # override eval.eval_every for the follower
    echo_logs: bool = True
    env: dict[str, str] = field(default_factory=dict)  # extra environment of every child


# --- resolving the config ----------------------------------------------------------------------


def _explicit(section, name: str) -> bool:
    return name in section.model_fields_set


def _inside(run_dir: Path, section, name: str, default_rel: str) -> None:
    """Left at its default: move the path inside the run dir; given: make it absolute."""
    if _explicit(section, name):
        value = getattr(section, name)
        if value and not Path(value).is_absolute():
            setattr(section, name, str(Path(value).resolve()))
    else:
        setattr(section, name, str(run_dir / default_rel))


def _port(section, name: str) -> int:
    value = getattr(section, name)
    if _explicit(section, name) and value:
        return value
    return free_port()


def resolve_config(cfg: JetrlConfig, run_dir: Path, write: bool = True) -> JetrlConfig:
    """The config every child reads: concrete ports and URLs, state paths inside `run_dir`, and NATS as a
    server to connect to (the launcher runs the embedded one itself). `write` false (`--dry-run`): the
    secret files are named but not created."""
    run_dir = run_dir.resolve()
    out = cfg.model_copy(deep=True)
    if out.nats.embedded:
        port = _port(out.nats, "port")
        _inside(run_dir, out.nats, "store_dir", "nats")
        out.nats.port = port
        out.nats.servers = [f"nats://127.0.0.1:{port}"]
    c = out.controller
    c.port = _port(c, "port")
    if not _explicit(c, "url"):
        c.url = f"http://{local_host(c.host)}:{c.port}"
    if not _explicit(c, "db_url"):
        c.db_url = f"sqlite:///{run_dir / 'controller.db'}"
    _inside(run_dir, c, "data_dir", "data")
    w = out.weights
    w.port = _port(w, "port")
    if not _explicit(w, "url"):
        w.url = f"http://{local_host(w.host)}:{w.port}"
    _inside(run_dir, w, "root", "weights")
    t = out.trainer
    _inside(run_dir, t, "checkpoint_dir", "checkpoints")
    _inside(run_dir, t, "publish_dir", "published")
    if out.tracking.enabled:
        _inside(run_dir, out.tracking, "dir", "tracking")
    if out.rollout.online.keys_dir:
        out.rollout.online.keys_dir = str(Path(out.rollout.online.keys_dir).expanduser().resolve())
    ev = getattr(out, "eval", None)
    if ev is not None and ev.dataset:
        ev.dataset = str(Path(ev.dataset).resolve())
    _run_secrets(out, run_dir / "secrets", write)
    return out


def _secret_into_file(section, name: str, path: Path, write: bool = True) -> None:
    """Make `section.<name>` come from a 0600 file: the user's file as given, an inline value moved into
    `path`, or a fresh random one in `path` (kept across `jetrl up` restarts of the same run dir)."""
    from shared.runtime.credentials import new_token, write_private

    if getattr(section, f"{name}_file"):
        setattr(section, f"{name}_file", str(Path(getattr(section, f"{name}_file")).expanduser().resolve()))
        return
    value = getattr(section, name)
    if write:
        if value:
            write_private(path, value + "\n")
        elif not path.is_file():
            write_private(path, new_token() + "\n")
        os.chmod(path, 0o600)
    setattr(section, name, "")
    setattr(section, f"{name}_file", str(path))


def _run_secrets(out: JetrlConfig, secrets_dir: Path, write: bool = True) -> None:
    """Authenticated by default: the controller's and the weight store's bearer tokens and the embedded NATS
    server's user + password live in 0600 files under `<run dir>/secrets/` (generated per run unless the
    config names them); the config every child reads holds their paths, never the values. A section with
    `insecure_no_auth: true` is left open (and its service logs a warning)."""
    if write:
        secrets_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(secrets_dir, 0o700)
    if not out.controller.insecure_no_auth:
        _secret_into_file(out.controller, "token", secrets_dir / "controller.token", write)
    if not out.weights.insecure_no_auth:
        _secret_into_file(out.weights, "token", secrets_dir / "weights.token", write)
        if out.weights.read_token or out.weights.read_token_file:
            _secret_into_file(out.weights, "read_token", secrets_dir / "weights.read_token", write)
    n = out.nats
    if n.embedded and not n.insecure_no_auth:
        if n.token or n.token_file:
            _secret_into_file(n, "token", secrets_dir / "nats.token", write)
        elif n.per_service_users:
            _nats_users(n, secrets_dir / "nats", write)
        else:
            n.user = n.user or "jetrl"
            _secret_into_file(n, "password", secrets_dir / "nats.password", write)
    elif n.password or n.token:  # an external server's credentials: out of the children's config too
        for name in ("password", "token"):
            if getattr(n, name):
                _secret_into_file(n, name, secrets_dir / f"nats.{name}", write)


def _nats_users(n, users_dir: Path, write: bool = True) -> None:
    """One NATS user per service role (shared/runtime/nats_permissions.py), each password in a 0600
    `<users_dir>/<role>.password` (kept across restarts of the run dir). The launcher's own identity (and
    the config.yaml default) is `jetrl-admin`; a password the config gives becomes the admin's."""
    from shared.runtime.credentials import new_token
    from shared.runtime.nats_permissions import ROLES, user_name

    admin = users_dir / "admin.password"
    if write:
        users_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(users_dir, 0o700)
        if n.password or n.password_file:
            if n.password_file:
                n.password = Path(n.password_file).expanduser().read_text().strip()
            write_private(admin, n.password + "\n")
        for role in ROLES:
            if not (users_dir / f"{role}.password").is_file():
                write_private(users_dir / f"{role}.password", new_token() + "\n")
    n.users_dir = str(users_dir)
    n.user, n.password, n.password_file = user_name("admin"), "", str(admin)


# Which NATS role each child of the plan connects as (children not named here do not use NATS).
NATS_ROLES = {"controller": "controller", "rollout": "rollout", "reward": "reward", "trainer": "trainer",
              "track": "tracker", "eval": "eval", "serve-policy": "rollout"}


def nats_identity(resolved: JetrlConfig, role: str) -> list[str]:
    """Config overrides connecting a child as its own NATS user (argv holds the password's file, never the
    password); every service but the controller binds to the streams instead of creating them."""
    from shared.runtime.nats_permissions import user_name

    users_dir = resolved.nats.users_dir
    if not users_dir:
        return []
    out = [f"nats.user={user_name(role)}", f"nats.password_file={Path(users_dir) / f'{role}.password'}"]
    return out if role == "controller" else out + ["streams.manage=false"]


def child_config(resolved: JetrlConfig) -> JetrlConfig:
    """What children read: they connect to the launcher's NATS instead of starting their own."""
    out = resolved.model_copy(deep=True)
    out.nats.embedded = False
    return out


# --- the process plan -------------------------------------------------------------------------


def _threads_env(n_torch: int, threads: int = 0) -> dict[str, str]:
    """OMP_NUM_THREADS of the torch processes (unless the user set OMP_NUM_THREADS): `threads`, or with
    0 the cores divided between the n_torch processes."""
    if "OMP_NUM_THREADS" in os.environ:
        return {}
    if threads:
        return {"OMP_NUM_THREADS": str(threads)}
    return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // max(1, n_torch)))}


def plan(resolved: JetrlConfig, config_file: Path, opts: UpOptions) -> list[ProcessSpec]:
    """Every child process of the run, in start order."""
    from rollout_service.evaluation.session import eval_config

    f = str(config_file)
    specs: list[ProcessSpec] = []
    n = resolved.nats
    if n.embedded:
        argv = CHILD + ["nats", "--port", str(n.port), "--store-dir", n.store_dir,
                        "--max-payload-mb", str(max(1, -(-n.max_payload // (1024 * 1024)))),
                        "--sync-interval", n.sync_interval]
        # credentials by file (never on a command line, which every user of the host can read in ps)
        if n.users_dir:
            argv += ["--users-dir", n.users_dir, "--run", resolved.run]
        elif n.user:
            argv += ["--user", n.user, "--password-file", n.password_file]
        elif n.token_file:
            argv += ["--token-file", n.token_file]
        else:
            argv += ["--insecure-no-auth"]
        specs.append(ProcessSpec("nats", argv, ready_line="nats-server nats://"))
    specs.append(ProcessSpec("controller", CHILD + ["controller", "-c", f]))
    specs.append(ProcessSpec("weights", CHILD + ["weights", "serve", "-c", f]))
    for i in range(opts.reward_replicas):
        name = "reward" if opts.reward_replicas == 1 else f"reward-{i}"
        specs.append(ProcessSpec(name, CHILD + ["reward", "serve", "-c", f]))
    ecfg = eval_config(resolved)
    eval_dataset = opts.eval_dataset or ecfg.dataset
    eval_every = opts.eval_every or ecfg.eval_every
    want_eval = opts.with_eval and bool(eval_dataset) and eval_every > 0
    per = resolved.rollout.service.workers_per_process
    n_proc = -(-opts.workers // per)  # rollout processes; the last may hold fewer workers
    threads = _threads_env(n_proc + resolved.trainer.nproc + (1 if want_eval else 0), resolved.launch.torch_threads)
    for i in range(n_proc):
        name = "rollout" if n_proc == 1 else f"rollout-{i}"
        count = min(per, opts.workers - i * per)
        specs.append(ProcessSpec(name, CHILD + ["rollout", "-c", f, "--worker", f"{resolved.run}-{name}",
                                                "--workers", str(count)], env=dict(threads)))
    if opts.online:
        specs.append(ProcessSpec("serve-policy", CHILD + ["serve-policy", "-c", f, "--worker", f"{resolved.run}-online"],
                                 env=dict(threads), ready_line="online endpoint on "))
    specs.append(ProcessSpec("trainer", CHILD + ["trainer", "-c", f, "--resume"], env=dict(threads)))
    if resolved.tracking.enabled:  # one more bus subscriber; the trainer and workers know nothing of it
        specs.append(ProcessSpec("track", CHILD + ["track", "-c", f]))
    if want_eval:
        specs.append(ProcessSpec("eval", CHILD + ["eval", "-c", f, "--follow", "--dataset",
                                                  str(Path(eval_dataset).resolve()), "--every", str(eval_every)],
                                 env=dict(threads)))
    for s in specs:
        s.env.update(opts.env)
        role = NATS_ROLES.get(s.name.rsplit("-", 1)[0] if s.name[-1:].isdigit() else s.name)
        if role:
            s.argv += nats_identity(resolved, role)
    return specs


def make_private(run_dir: Path) -> None:
    """launch.private_files: umask 077 for this process and so for every child it starts (0700 dirs, 0600
    files), and group/other access removed from what `run_dir` already holds (ours; links not followed)."""
    import stat

    os.umask(0o077)
    run_dir.mkdir(parents=True, exist_ok=True)
    uid = os.getuid()
    for root, dirs, files in os.walk(run_dir):
        for name in (*dirs, *files):
            p = os.path.join(root, name)
            st = os.lstat(p)
            if st.st_uid == uid and not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
                os.chmod(p, stat.S_IMODE(st.st_mode) & ~0o077)
    os.chmod(run_dir, 0o700)


def write_resolved(cfg: JetrlConfig, opts: UpOptions) -> tuple[JetrlConfig, Path]:
    """Resolve, write `<run dir>/config.yaml` (the children's view), return (resolved, path)."""
    if cfg.launch.private_files:
        make_private(opts.run_dir)
    opts.run_dir.mkdir(parents=True, exist_ok=True)
    resolved = resolve_config(cfg, opts.run_dir)
    path = opts.run_dir.resolve() / "config.yaml"
    write_private(path, dump_config(child_config(resolved)))  # 0600: it names the secret files
    return resolved, path


def dry_run_text(cfg: JetrlConfig, opts: UpOptions) -> str:
    """What `jetrl up` would write and start; it writes nothing (no run dir, config or secret file)."""
    import shlex

    resolved = resolve_config(cfg, opts.run_dir, write=False)
    path = opts.run_dir.resolve() / "config.yaml"
    specs = plan(resolved, path, opts)
    ports = assign_metrics_ports(specs, resolved.telemetry)
    lines = [f"# resolved config (written to {path} at start and read by every process; --dry-run writes "
             "nothing)", dump_config(child_config(resolved)).rstrip(), "", "# processes"]
    for s in specs:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in s.env.items())
        lines.append(f"{s.name}: {env + ' ' if env else ''}{shlex.join(s.argv)}")
    lines += ["", "# metrics ports (telemetry.metrics_base_port + offset)"]
    lines += [f"{name}: {port}" for name, port in ports.items()]
    return "\n".join(lines) + "\n"
