"""`jetrl up -c CONFIG`: every service of a run as supervised child processes on this host.

    nats (embedded, unless nats.embedded is false) -> controller -> weights -> reward x R
        -> rollout x N -> trainer (nproc via trainer.nproc) -> track (when tracking.enabled)
        -> eval (when eval.dataset + eval.eval_every)

The run dir gets `config.yaml`, the *resolved* config every child reads: free ports for NATS, the
controller and the weight store, and the state paths the config leaves at their defaults (database,
datasets, weights, checkpoints) moved inside the run dir. Children are ordinary `jetrl <service>`
processes (`python -m launcher.cli ...`), so what runs here is exactly what runs on separate hosts.
What is started, with which config and command line, is planned by launcher/plan.py.
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
import socket
import time
from pathlib import Path
from typing import Any

from launcher.metrics_ports import MetricsPortError, assign_metrics_ports, local_host
from launcher.plan import UpOptions, plan, write_resolved
from launcher.supervisor import Supervisor
from shared.config import JetrlConfig

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

        from shared.runtime.credentials import redacted_dump

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

    @staticmethod
    def run_complete(snap: dict) -> bool:
        """The controller says every enqueued prompt is released and decided (controller/completion.py)."""
        return bool(((snap.get("run") or {}).get("progress") or {}).get("complete"))

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
    """`jetrl up`: start everything, optionally enqueue a dataset, show the panel until Ctrl-C, the
    trainer finished schedule.total_steps or the run is complete (its data all decided, completion.py);
    then stop everything cleanly."""
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
                if launcher.run_complete(snap) and not keep_running:
                    led = snap["run"]["ledger"]
                    console.print(f"run complete: every enqueued prompt is decided ({led['trained']} trained, "
                                  f"{led['dropped_stale']} dropped as stale, {led['filtered']} filtered, "
                                  f"{led['dead_lettered']} dead-lettered)")
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
