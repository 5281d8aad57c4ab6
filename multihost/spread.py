"""A whole run spread over hosts (network namespaces, multihost/netns.py), with host-level faults, audited
like the fault suite (testkit/fault_scenario.py: the ledger balances, nothing in flight, no group
trained twice in the final model's lineage).

    host a: nats n1 + controller          host b: nats n2 + weight store     host c: nats n3 + trainer
    host d: rollout worker + reward       host e: rollout worker + reward    (host f: a worker added later)

Every service lists the three NATS nodes; streams and the weights KV bucket have three replicas; workers
fetch each version over HTTP from host b (`weights.shared_fs: false`, a cache dir per host). Each service
connects to NATS as its own user (multihost/cluster.py: `jetrl-controller`, `jetrl-rollout`, ... scoped to the
run, as `jetrl up` does); the scenario itself as `jetrl-admin`. Faults:
`kill_nats_node()` (SIGKILL n1; the run goes on; n1 restarts on its store and catches up), `cut_link("d")`
(host d's cable out for 20 s, then back), `kill_host("e")` (every process on e), `add_worker("f")`.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from multihost.cluster import NatsCluster
from multihost.netns import HostNet
from shared.config import JetrlConfig, dump_config, load_config
from shared.runtime.auth import bearer_headers
from shared.runtime.credentials import new_token, write_private
from testkit.fault_scenario import IN_FLIGHT_STATES, FaultOutcome, FaultScenario

CLI = [sys.executable, "-m", "launcher.cli"]
HOSTS = ("a", "b", "c", "d", "e")
CONTROLLER_PORT, WEIGHTS_PORT = 8600, 8700


@dataclass
class HostProc:
    host: str
    proc: object  # subprocess.Popen


class HostProcs:
    """The supervisor-shaped view of the processes started on hosts (FaultScenario reads `status()`);
    nothing restarts them: a killed host's processes stay dead."""

    def __init__(self):
        self.procs: dict[str, HostProc] = {}

    def status(self) -> dict[str, dict]:
        out = {}
        for name, hp in self.procs.items():
            code = hp.proc.poll()
            out[name] = {"pid": hp.proc.pid, "running": code is None, "restarts": 0, "last_exit": code,
                         "finished": code == 0, "host": hp.host}
        return out


class HostLauncher:
    """What FaultScenario needs of a launcher, for services on hosts: the controller's HTTP API,
    enqueueing, process status."""

    def __init__(self, cfg: JetrlConfig, resolved: JetrlConfig):
        import httpx

        self.cfg, self.resolved = cfg, resolved
        self.http = httpx.AsyncClient(base_url=resolved.controller.url, timeout=30.0,
                                      headers=bearer_headers(resolved.controller.secret("token")))
        self.sup = HostProcs()

    @property
    def run(self) -> str:
        return self.resolved.run

    async def _check(self, resp):
        if resp.status_code >= 400:
            raise RuntimeError(f"controller {resp.request.method} {resp.request.url.path}: {resp.status_code} "
                               f"{resp.text[:500]}")
        return resp.json()

    async def _controller_up(self) -> bool:
        try:
            r = await self.http.get("/v1/health")
            return r.status_code == 200 and r.json().get("nats") == "connected"
        except Exception:
            return False

    async def create_run(self) -> dict:
        return await self._check(await self.http.post("/v1/runs", content=dump_config(self.cfg).encode(),
                                                      headers={"Content-Type": "application/yaml"}))

    async def enqueue(self, path) -> dict:
        d = await self._check(await self.http.post("/v1/datasets/path", json={"path": str(Path(path).resolve())}))
        return await self._check(await self.http.post(f"/v1/runs/{self.run}/enqueues",
                                                      json={"dataset": str(d["id"]), "epochs": 1}))

    def trainer_done(self, snap: dict) -> bool:
        st = snap.get("children", {}).get("trainer", {})
        return bool(st.get("finished") and st.get("last_exit") == 0)

    async def stop(self) -> None:
        await self.http.aclose()


class SpreadScenario(FaultScenario):
    FAULTS = ("nats-node", "cut-link", "kill-host", "add-worker")

    def __init__(self, root: Path, *, steps_per_slice: int = 6, cut_s: float = 20.0, **kw):
        super().__init__(root, run="spread", steps_per_slice=steps_per_slice, **kw)
        self.slices = len(self.FAULTS) + 2  # a slice per fault, the first one, and the last (with slack)
        self.total_steps = self.slices * steps_per_slice
        self.cut_s = cut_s
        self.net: HostNet | None = None
        self.cluster: NatsCluster | None = None
        self.config_file = self.root / "spread.yaml"
        self.logs = self.root / "run" / "logs"

    # --- set-up -------------------------------------------------------------------------------------
    def spread_config(self) -> tuple[JetrlConfig, JetrlConfig]:
        """(the run's config as the controller stores it, the config every process reads)."""
        self.config()  # the fault suite's demo-sized run, written to faults.yaml
        data = yaml.safe_load((self.root / "faults.yaml").read_text())
        data["nats"] = {"embedded": False}
        data["reward"]["timeout_s"] = 3.0  # a request routed to a cut-off replica is retried sooner
        a, b = self.net.addr("a"), self.net.addr("b")
        data.update(streams={"replicas": 3})
        full = dict(data)
        admin = self.cluster.identity("admin")  # the scenario's own identity; each service gets its role's
        full["nats"] = {"servers": self.cluster.urls, "user": admin["nats.user"],
                        "password_file": admin["nats.password_file"],
                        "reconnect_wait_s": 0.2, "max_reconnect_wait_s": 2.0}
        secrets = self.root / "secrets"  # the controller's and weight store's bearer tokens, as `jetrl up` makes them
        for name in ("controller", "weights"):
            if not (secrets / f"{name}.token").is_file():
                write_private(secrets / f"{name}.token", new_token() + "\n")
        full["controller"] = {"host": a, "port": CONTROLLER_PORT, "url": f"http://{a}:{CONTROLLER_PORT}",
                              "db_url": f"sqlite:///{self.root / 'host-a' / 'controller.db'}",
                              "data_dir": str(self.root / "host-a" / "datasets"),
                              "token_file": str(secrets / "controller.token"),
                              "path_roots": [str(self.root / "data")]}  # the slices are enqueued by path
        full["weights"] = {"host": b, "port": WEIGHTS_PORT, "url": f"http://{b}:{WEIGHTS_PORT}",
                           "root": str(self.root / "host-b" / "weights"), "shared_fs": False,
                           "token_file": str(secrets / "weights.token")}
        full["trainer"] = dict(full["trainer"], checkpoint_dir=str(self.root / "host-c" / "checkpoints"))
        self.config_file.write_text(yaml.safe_dump(full, sort_keys=False))
        for h in HOSTS:
            (self.root / f"host-{h}").mkdir(parents=True, exist_ok=True)
        return JetrlConfig.model_validate(data), load_config(JetrlConfig, str(self.config_file), [])

    def spawn(self, name: str, host: str, argv: list[str]) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        proc = self.net.spawn(host, argv, log=self.logs / f"{name}.log", env={"OMP_NUM_THREADS": "1"})
        self.launcher.sup.procs[name] = HostProc(host, proc)

    def nats_identity(self, role: str | None) -> list[str]:
        """The overrides connecting a service as its role's NATS user (None: a service without NATS)."""
        return [f"{k}={v}" for k, v in self.cluster.identity(role).items()] if role else []

    def service(self, name: str, host: str, *args: str, role: str | None = None) -> None:
        extra = [f"weights.cache_dir={self.root / f'host-{host}' / 'cache'}", *self.nats_identity(role)]
        self.spawn(name, host, CLI + list(args) + ["-c", str(self.config_file), *extra])

    def rollout(self, host: str) -> None:
        self.spawn(f"rollout-{host}", host, CLI + ["rollout", "-c", str(self.config_file), "--worker",
                                                   f"spread-rollout-{host}",
                                                   f"weights.cache_dir={self.root / f'host-{host}' / 'cache'}",
                                                   *self.nats_identity("rollout")])

    async def start(self) -> None:
        self._phase(self.wait_s)
        self.net = HostNet(HOSTS).create()
        self.cluster = NatsCluster(self.net, {"n1": "a", "n2": "b", "n3": "c"}, self.root / "nats", run=self.run)
        await asyncio.to_thread(self.cluster.start_all, 90)
        user, resolved = self.spread_config()
        self.launcher = HostLauncher(user, resolved)
        for n, h in self.cluster.nodes.items():
            self.launcher.sup.procs[f"nats-{n}"] = HostProc(h, self.cluster.procs[n])
        self.service("controller", "a", "controller", role="controller")
        self.service("weights", "b", "weights", "serve")  # does not use NATS
        await self._until(self.launcher._controller_up, "the controller on host a")
        await self._retry(self.launcher.create_run, "creating the run")
        for h in ("d", "e"):
            self.service(f"reward-{h}", h, "reward", "serve", role="reward")
            self.rollout(h)
        self.spawn("trainer", "c", CLI + ["trainer", "-c", str(self.config_file), "--resume",
                                          *self.nats_identity("trainer")])
        await self.next_slice()
        await self._until(lambda: self._step_at_least(2), "the first trainer steps")

    async def stop(self) -> None:
        if self.launcher is not None:
            await self.launcher.stop()
        if self.net is not None:
            self.net.close()

    # --- faults ---------------------------------------------------------------------------------------
    async def _begin(self, fault: str) -> tuple[float, list[str], int]:
        self._phase(self.wait_s)
        await self.next_slice()
        mark = self._mark_step
        await self._until(lambda: self._step_at_least(mark + 2), "the trainer to make steps")
        return time.time(), [g for g, _ in self._ledger_rows(IN_FLIGHT_STATES)], await self._last_step()

    async def _published_by(self, worker: str, after: float) -> float | None:
        for e in await self.events("published"):
            if e["time"] > after and e["data"].get("worker") == worker:
                return e["time"]
        return None

    async def _health_of(self, instance: str, after: float) -> float | None:
        h = await self._api("/v1/health")
        seen = [x["last_seen"] for x in h.get("services", []) if x["instance"] == instance and x["last_seen"] > after]
        return min(seen) if seen else None

    async def _end(self, out: FaultOutcome) -> FaultOutcome:
        self.outcomes.append(out)
        self._mark_step = await self._retry(self._last_step, "reading the trainer's step")
        return out

    async def kill_nats_node(self, name: str = "n1") -> FaultOutcome:
        """SIGKILL one NATS node; the run must make steps while it is down; then it restarts on its store."""
        t0, in_flight, step = await self._begin("nats-node")
        self.cluster.procs[name].send_signal(signal.SIGKILL)
        await asyncio.to_thread(self.cluster.procs[name].wait, 30)
        await self._until(lambda: self._step_at_least(step + 2), f"trainer steps with NATS node {name} down")
        t_progress = time.time()
        self.cluster.start(name)
        self.launcher.sup.procs[f"nats-{name}"] = HostProc(self.cluster.nodes[name], self.cluster.procs[name])
        await asyncio.to_thread(self.cluster.wait_ready, 60, [name])
        t_back = time.time()
        return await self._end(FaultOutcome("nats-node", t0, back_s=t_back - t0, progress_s=t_progress - t0,
                                            progress="2 trainer steps with the node down",
                                            in_flight_at_kill=in_flight))

    async def cut_link(self, host: str = "d") -> FaultOutcome:
        """Pull host's cable for cut_s seconds; the other host's workers carry on; then plug it back and
        wait until its worker reports again. Its unacked prompts were redelivered meanwhile; groups it
        finishes late are duplicates the trainer drops (the final audit finds none trained twice)."""
        t0, in_flight, step = await self._begin("cut-link")
        self.net.cut(host)
        try:
            await self._until(lambda: self._step_at_least(step + 2), f"trainer steps while host {host} is cut off")
            t_progress = time.time()
            await asyncio.sleep(max(0.0, t0 + self.cut_s - time.time()))
        finally:
            self.net.restore(host)
        t_restored = time.time()
        # back: its worker's health events reach the controller again (it may find no prompts left to
        # work on: the other host took the slice while it was away)
        t_back = await self._until(lambda: self._health_of(f"spread-rollout-{host}", t_restored),
                                   f"host {host}'s worker to report again after the link came back")
        return await self._end(FaultOutcome("cut-link", t0, back_s=t_back - t0, progress_s=t_progress - t0,
                                            progress=f"trainer steps without host {host}",
                                            in_flight_at_kill=in_flight,
                                            note=f"link down {t_restored - t0:.1f}s"))

    async def kill_host(self, host: str = "e") -> FaultOutcome:
        """Every process on `host` dies (SIGKILL); the others redo its work."""
        t0, in_flight, step = await self._begin("kill-host")
        pids = await asyncio.to_thread(self.net.kill_all, host)
        await self._until(lambda: self._step_at_least(step + 2), f"trainer steps after host {host} died")
        return await self._end(FaultOutcome("kill-host", t0, back_s=0.0, progress_s=time.time() - t0,
                                            progress=f"trainer steps without host {host}",
                                            in_flight_at_kill=in_flight, note=f"killed pids {pids}"))

    async def add_worker(self, host: str = "f") -> FaultOutcome:
        """A new host joins mid-run with a rollout worker: once it reports healthy, the next slice of
        prompts is enqueued, and the new worker must publish some of its groups."""
        self._phase(self.wait_s)
        t0 = time.time()
        self.net.add_host(host)
        self.rollout(host)

        await self._until(lambda: self._health_of(f"spread-rollout-{host}", t0),
                          f"the worker on the new host {host} to report healthy")
        in_flight = [g for g, _ in self._ledger_rows(IN_FLIGHT_STATES)]
        await self.next_slice()
        t_pub = await self._until(lambda: self._published_by(f"spread-rollout-{host}", t0),
                                  f"the worker on the new host {host} to publish groups")
        return await self._end(FaultOutcome("add-worker", t0, back_s=t_pub - t0, progress_s=t_pub - t0,
                                            progress="groups published by the new worker",
                                            in_flight_at_kill=in_flight))
