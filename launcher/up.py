"""`jetrl up -c CONFIG`: every service of a run as supervised child processes on this host.

    nats (embedded, unless nats.embedded is false) -> controller -> weights -> reward x R
        -> rollout x N -> trainer (nproc via trainer.nproc) -> track (when tracking.enabled)
        -> eval (when eval.dataset + eval.eval_every)

The run dir gets `config.yaml`, the *resolved* config every child reads: free ports for NATS, the
controller and the weight store, and the state paths the config leaves at their defaults (database,
datasets, weights, checkpoints) moved inside the run dir. Children are ordinary `jetrl <service>`
processes (`python -m launcher.cli ...`), so what runs here is exactly what runs on separate hosts.
Logs: prefixed on the terminal and in `<run dir>/logs/<name>.log`. Crashed children restart with
back-off (launcher/supervisor.py), until one fails `launch.crash_loop_restarts` times within
`launch.crash_loop_window_s`: then the run stops with that child's last log lines. A config that cannot
run on this host (launcher/preflight.py: cuda without a GPU, ...) fails before anything starts. Ctrl-C
stops them in reverse order (trainer and rollouts first, so
in-flight work is acked or left for redelivery, then NATS last).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.metrics_ports import MetricsPortError, assign_metrics_ports, local_host
from launcher.supervisor import ProcessSpec, Supervisor
from shared.config import JetrlConfig, dump_config
from shared.credentials import write_private
from shared.natsd import free_port

CHILD = [sys.executable, "-m", "launcher.cli"]
TORCH_CHILDREN = ("rollout", "trainer", "eval")


@dataclass
class UpOptions:
    run_dir: Path
    workers: int = 1  # rollout workers
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


def resolve_config(cfg: JetrlConfig, run_dir: Path) -> JetrlConfig:
    """The config every child reads: concrete ports and URLs, state paths inside `run_dir`, and NATS as a
    server to connect to (the launcher runs the embedded one itself)."""
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
    ev = getattr(out, "eval", None)
    if ev is not None and ev.dataset:
        ev.dataset = str(Path(ev.dataset).resolve())
    _run_secrets(out, run_dir / "secrets")
    return out


def _secret_into_file(section, name: str, path: Path) -> None:
    """Make `section.<name>` come from a 0600 file: the user's file as given, an inline value moved into
    `path`, or a fresh random one in `path` (kept across `jetrl up` restarts of the same run dir)."""
    from shared.credentials import new_token, write_private

    if getattr(section, f"{name}_file"):
        setattr(section, f"{name}_file", str(Path(getattr(section, f"{name}_file")).expanduser().resolve()))
        return
    value = getattr(section, name)
    if value:
        write_private(path, value + "\n")
    elif not path.is_file():
        write_private(path, new_token() + "\n")
    os.chmod(path, 0o600)
    setattr(section, name, "")
    setattr(section, f"{name}_file", str(path))


def _run_secrets(out: JetrlConfig, secrets_dir: Path) -> None:
    """Authenticated by default: the controller's and the weight store's bearer tokens and the embedded NATS
    server's user + password live in 0600 files under `<run dir>/secrets/` (generated per run unless the
    config names them); the config every child reads holds their paths, never the values. A section with
    `insecure_no_auth: true` is left open (and its service logs a warning)."""
    secrets_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(secrets_dir, 0o700)
    if not out.controller.insecure_no_auth:
        _secret_into_file(out.controller, "token", secrets_dir / "controller.token")
    if not out.weights.insecure_no_auth:
        _secret_into_file(out.weights, "token", secrets_dir / "weights.token")
        if out.weights.read_token or out.weights.read_token_file:
            _secret_into_file(out.weights, "read_token", secrets_dir / "weights.read_token")
    n = out.nats
    if n.embedded and not n.insecure_no_auth:
        if n.token or n.token_file:
            _secret_into_file(n, "token", secrets_dir / "nats.token")
        else:
            n.user = n.user or "jetrl"
            _secret_into_file(n, "password", secrets_dir / "nats.password")
    elif n.password or n.token:  # an external server's credentials: out of the children's config too
        for name in ("password", "token"):
            if getattr(n, name):
                _secret_into_file(n, name, secrets_dir / f"nats.{name}")


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
        if n.user:
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
    n_torch = opts.workers + resolved.trainer.nproc + (1 if want_eval else 0)
    threads = _threads_env(n_torch, resolved.launch.torch_threads)
    for i in range(opts.workers):
        name = "rollout" if opts.workers == 1 else f"rollout-{i}"
        specs.append(ProcessSpec(name, CHILD + ["rollout", "-c", f, "--worker", f"{resolved.run}-{name}"],
                                 env=dict(threads)))
    specs.append(ProcessSpec("trainer", CHILD + ["trainer", "-c", f, "--resume"], env=dict(threads)))
    if resolved.tracking.enabled:  # one more bus subscriber; the trainer and workers know nothing of it
        specs.append(ProcessSpec("track", CHILD + ["track", "-c", f]))
    if want_eval:
        specs.append(ProcessSpec("eval", CHILD + ["eval", "-c", f, "--follow", "--dataset",
                                                  str(Path(eval_dataset).resolve()), "--every", str(eval_every)],
                                 env=dict(threads)))
    for s in specs:
        s.env.update(opts.env)
    return specs


def write_resolved(cfg: JetrlConfig, opts: UpOptions) -> tuple[JetrlConfig, Path]:
    """Resolve, write `<run dir>/config.yaml` (the children's view), return (resolved, path)."""
    opts.run_dir.mkdir(parents=True, exist_ok=True)
    resolved = resolve_config(cfg, opts.run_dir)
    path = opts.run_dir.resolve() / "config.yaml"
    write_private(path, dump_config(child_config(resolved)))  # 0600: it names the secret files
    return resolved, path


def dry_run_text(cfg: JetrlConfig, opts: UpOptions) -> str:
    import shlex

    resolved, path = write_resolved(cfg, opts)
    specs = plan(resolved, path, opts)
    ports = assign_metrics_ports(specs, resolved.telemetry)
    lines = [f"# resolved config (read by every process): {path}", path.read_text().rstrip(), "", "# processes"]
    for s in specs:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in s.env.items())
        lines.append(f"{s.name}: {env + ' ' if env else ''}{shlex.join(s.argv)}")
    lines += ["", "# metrics ports (telemetry.metrics_base_port + offset)"]
    lines += [f"{name}: {port}" for name, port in ports.items()]
    return "\n".join(lines) + "\n"


# --- the launcher -----------------------------------------------------------------------------


async def poll_until(check, timeout_s: float, what: str, every_s: float = 0.5):
    """Await `check()` every `every_s` until it returns something truthy (returned); TimeoutError naming
    `what` after `timeout_s`. For scripts and tests driving a launched run."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = await check()
        if got:
            return got
        await asyncio.sleep(every_s)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def _port_open(url: str) -> bool:
    from urllib.parse import urlparse

    u = urlparse(url)
    try:
        with socket.create_connection((u.hostname or "127.0.0.1", u.port or 80), timeout=0.5):
            return True
    except OSError:
        return False


class Launcher:
    """Start a run's processes, talk to its controller, stop it. Used by `jetrl up` and `jetrl demo`."""

    def __init__(self, cfg: JetrlConfig, opts: UpOptions, console=None):
        self.cfg, self.opts, self.console = cfg, opts, console
        self.resolved, self.config_file = write_resolved(cfg, opts)
        self.specs = plan(self.resolved, self.config_file, opts)
        self.metrics_ports = assign_metrics_ports(self.specs, self.resolved.telemetry)
        self.sup: Supervisor | None = None
        self.http = None
        self.steps: list[dict] = []  # trainer "step" event data (+ "time"), oldest first
        self.evals: list[dict] = []  # "eval" event data
        self._after = {"step": 0, "eval": 0}

    @property
    def run(self) -> str:
        return self.resolved.run

    async def start(self, timeout_s: float = 120.0) -> None:
        """NATS first, then controller and weight store (waiting until they answer), then the rest."""
        import httpx

        self.http = httpx.AsyncClient(base_url=self.resolved.controller.url, timeout=30.0,
                                      headers=self._auth(self.resolved.controller.secret("token")))
        first = [s for s in self.specs if s.name == "nats"]
        lc = self.resolved.launch
        self.sup = Supervisor(first, self.opts.run_dir, console=self.console, echo=self.opts.echo_logs,
                              crash_loop_restarts=lc.crash_loop_restarts, crash_loop_window_s=lc.crash_loop_window_s,
                              error_lines=lc.error_lines)
        await self.sup.start()
        if first:
            await self._wait(lambda: _port_open(self.resolved.nats.servers[0]), "nats", timeout_s)
        for s in self.specs:
            if s.name in ("controller", "weights"):
                await self.sup.add(s)
        await self._wait(self._controller_up, "controller", timeout_s)
        await self._wait(lambda: _port_open(self.resolved.weights.url), "weights", timeout_s)
        await self.create_run()
        for s in self.specs:
            if s.name not in ("nats", "controller", "weights"):
                await self.sup.add(s)

    def endpoints(self) -> list[tuple[str, str]]:
        """(what, URL) of everything a user may open or scrape: dashboard, REST, metrics, NATS."""
        r = self.resolved
        c, w = r.controller, r.weights
        host = local_host(r.telemetry.metrics_host)
        token = f"/#token=<the token in {c.token_file}>" if c.token_file else "/"
        out = [("dashboard", c.url + token), ("controller API", f"{c.url}/docs"),
               ("controller metrics", f"{c.url}/metrics"), ("weights metrics", f"{w.url}/metrics")]
        out += [(f"{name} metrics", f"http://{host}:{port}/metrics") for name, port in self.metrics_ports.items()]
        out += [("nats", s) for s in r.nats.servers]
        return out

    @staticmethod
    def _auth(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def _wait(self, check, name: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ok = check()
            if asyncio.iscoroutine(ok):
                ok = await ok
            if ok:
                return
            if self.sup.failure is not None:
                raise RuntimeError(self.sup.failure.message())
            st = self.sup.status().get(name, {})
            if st.get("last_exit") is not None and not st.get("running") and st.get("restarts", 0) >= 3:
                break
            await asyncio.sleep(0.2)
        log = self.opts.run_dir / "logs" / f"{name}.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise RuntimeError(f"{name} did not come up in {timeout_s:.0f}s; its log ({log}) ends:\n{tail}")

    async def _controller_up(self) -> bool:
        try:
            r = await self.http.get("/v1/health")
            return r.status_code == 200 and r.json().get("nats") == "connected"
        except Exception:
            return False

    async def _check(self, resp) -> Any:
        if resp.status_code >= 400:
            try:
                detail = resp.json().get("detail", resp.text)
            except ValueError:
                detail = resp.text
            raise RuntimeError(f"controller {resp.request.method} {resp.request.url.path}: {resp.status_code} {detail}")
        return resp.json()

    async def create_run(self) -> dict:
        """Create the run from the user's config (without the launcher's ports, so it is the same run
        when `up` is started again)."""
        import yaml

        from shared.credentials import redacted_dump

        body = yaml.safe_dump(redacted_dump(self.cfg, placeholder=""), sort_keys=False).encode()  # no secrets
        return await self._check(await self.http.post("/v1/runs", content=body,
                                                      headers={"Content-Type": "application/yaml"}))

    async def enqueue(self, path: str | Path, epochs: int = 1, shuffle_seed: int | None = None,
                      limit: int | None = None) -> dict:
        """Upload a JSONL/Parquet file (server-side paths are off unless controller.path_roots names its dir)
        and enqueue it into the run."""
        p = Path(path).resolve()
        with open(p, "rb") as f:
            d = await self._check(await self.http.post("/v1/datasets", files={"file": (p.name, f)}, timeout=600.0))
        return await self._check(await self.http.post(f"/v1/runs/{self.run}/enqueues", json={
            "dataset": str(d["id"]), "epochs": epochs, "shuffle_seed": shuffle_seed, "limit": limit}))

    async def _new_events(self, kind: str) -> list[dict]:
        out = []
        while True:
            after = self._after.get(kind, 0)
            evs = await self._check(await self.http.get(f"/v1/runs/{self.run}/events",
                                                        params={"kind": kind, "after": after, "limit": 1000}))
            out += evs
            if evs:
                self._after[kind] = evs[-1]["id"]
            if len(evs) < 1000:
                return out

    async def poll(self) -> dict:
        """One status snapshot: run, ledger, queues, services (controller API) + children (supervisor).
        Also appends new trainer steps and evaluations to `steps` / `evals`."""
        snap: dict[str, Any] = {"children": self.sup.status() if self.sup else {}, "time": time.time()}
        try:
            snap["run"] = await self._check(await self.http.get(f"/v1/runs/{self.run}"))
            snap["queues"] = await self._check(await self.http.get(f"/v1/runs/{self.run}/queues"))
            snap["health"] = await self._check(await self.http.get("/v1/health"))
            for e in await self._new_events("step"):
                self.steps.append(dict(e["data"], time=e["time"]))
            for e in await self._new_events("eval"):
                self.evals.append(dict(e["data"], time=e["time"]))
        except Exception as exc:  # the controller is restarting: show what the supervisor knows
            snap["error"] = f"{type(exc).__name__}: {exc}"
        snap["steps"], snap["evals"] = self.steps, self.evals
        return snap

    async def timings(self) -> dict:
        """Per-version stage timings (controller/timings.py) of the whole run."""
        return await self._check(await self.http.get(f"/v1/runs/{self.run}/timings"))

    async def print_time_table(self) -> None:
        """The "where did the time go" table (launcher/time_report.py); a controller gone says so instead."""
        from rich.console import Console

        from launcher.time_report import time_table

        console = self.console or Console()
        try:
            console.print(time_table(await self.timings()))
        except Exception as exc:
            console.print(f"(no stage timings: {type(exc).__name__}: {exc})", markup=False)

    def trainer_done(self, snap: dict) -> bool:
        """The trainer finished schedule.total_steps: it exited with 0 by itself (a clean exit is never
        restarted). Not the version: after a resume from an older checkpoint versions run ahead of steps."""
        total = self.resolved.schedule.total_steps
        st = snap.get("children", {}).get("trainer", {})
        return bool(total and st.get("finished") and st.get("last_exit") == 0)

    async def stop_child(self, name: str, timeout_s: float = 60.0) -> None:
        """SIGTERM one child and wait for it; it is not restarted."""
        import signal

        c = self.sup.children[name]
        c.spec.restart = False
        if c.proc is not None and c.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                c.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(c.proc.wait(), timeout_s)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    c.proc.kill()

    async def stop(self) -> None:
        if self.sup is not None:
            await self.sup.stop()
        if self.http is not None:
            await self.http.aclose()


def endpoints_text(launcher: Launcher) -> str:
    rows = launcher.endpoints()
    width = max(len(name) for name, _ in rows)
    warn = "" if launcher.resolved.controller.token_file else "\n  (NO controller token: controller.insecure_no_auth)"
    return "endpoints:\n" + "\n".join(f"  {name:<{width}}  {url}" for name, url in rows) + warn


async def up_main(cfg: JetrlConfig, opts: UpOptions, dataset: str | None = None, epochs: int = 1,
                  shuffle_seed: int | None = None, keep_running: bool = False, panel: bool = True) -> int:
    """`jetrl up`: start everything, optionally enqueue a dataset, show the panel until Ctrl-C or the
    trainer finished schedule.total_steps; then stop everything cleanly."""
    import signal

    from rich.console import Console
    from rich.live import Live

    from launcher.preflight import preflight
    from launcher.up_status import render

    console = Console()
    problems = preflight(cfg)
    if problems:
        console.print("[red]error:[/] this config cannot run on this host:\n  " + "\n  ".join(problems))
        return 2
    try:
        launcher = Launcher(cfg, opts, console=console)
    except MetricsPortError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    console.print(f"[bold]jetrl up[/]: run {launcher.run}, run dir {opts.run_dir}, config {launcher.config_file}")
    code = 0
    try:
        start = asyncio.create_task(launcher.start())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({start, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not start.done():
            start.cancel()
            with contextlib.suppress(BaseException):
                await start
            return 130
        start.result()
        if dataset:
            e = await launcher.enqueue(dataset, epochs=epochs, shuffle_seed=shuffle_seed)
            console.print(f"enqueued {e['total']} prompts of {dataset} into {launcher.run}")
        console.print(endpoints_text(launcher) + "\nCtrl-C to stop", markup=False)
        live = Live(console=console, refresh_per_second=2, transient=False) if panel else contextlib.nullcontext()
        with live:
            while not stop.is_set():
                snap = await launcher.poll()
                if panel:
                    live.update(render(launcher.resolved, snap))
                if launcher.sup.failure is not None:
                    raise RuntimeError(launcher.sup.failure.message())
                if launcher.trainer_done(snap) and not keep_running:
                    console.print(f"trainer finished {launcher.resolved.schedule.total_steps} steps")
                    break
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
    except RuntimeError as exc:
        console.print(f"[red]error:[/] {exc}")
        code = 1
    finally:
        if launcher.steps:
            await launcher.print_time_table()
        console.print("stopping services ...")
        await launcher.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return code
