"""deploy/helm/jetrl rendered by Helm's own engine (helm-python-sdk: the Helm v4 Go SDK behind a C ABI, no
helm binary) with the official NATS chart (vendored under charts/nats) on and off, every manifest checked
against the Kubernetes schemas (kubernetes-validate, strict), and every jetrl container's command and
JETRL__* environment checked against the CLI and the config models."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ci_gate import need_module

from shared.config import JetrlConfig, load_config

helm = need_module("helm_python", "helm-python-sdk, dev extra")  # renders the chart with Helm's own Go engine
kubernetes_validate = need_module("kubernetes_validate", "kubernetes-validate, dev extra")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "jetrl"
K8S_VERSION = "1.30.0"


def render(values: dict, name: str = "rl") -> list[dict]:
    with helm.Chart.load(str(CHART)) as chart:
        out = chart.render(values, name=name, namespace="ml")
    docs = []
    for path, text in out.items():
        if path.endswith(".txt"):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def by_kind(docs, kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def containers(docs) -> dict[str, dict]:
    out = {}
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["labels"].get("app.kubernetes.io/name") == "jetrl":
            for c in d["spec"]["template"]["spec"]["containers"]:
                out[c["name"]] = c
    return out


@pytest.fixture(scope="module")
def default_docs():
    return render({})


def test_every_manifest_validates_against_the_kubernetes_schemas(default_docs):
    external = render({"nats": {"enabled": False}, "externalNats": {"servers": ["nats://n1:4222"]},
                       "rollout": {"gpus": 1, "replicas": 4}, "trainer": {"gpus": 2},
                       "weights": {"sharedFs": True, "persistence": {"accessMode": "ReadWriteMany"}},
                       "secrets": {"controllerToken": "c", "weightsToken": "w"}})
    for doc in default_docs + external:
        if doc["kind"] == "Pod" and doc["metadata"].get("annotations", {}).get("helm.sh/hook") == "test":
            continue  # the NATS chart's own `helm test` pod
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises with the offending path


def test_the_nats_cluster_comes_from_the_official_chart_and_every_service_lists_all_three(default_docs):
    sts = by_kind(default_docs, "StatefulSet")
    assert sts["rl-nats"]["spec"]["replicas"] == 3
    conf = by_kind(default_docs, "ConfigMap")["rl-nats-config"]["data"]["nats.conf"]
    routes = [f"nats://rl-nats-{i}.rl-nats-headless:6222" for i in range(3)]
    assert all(r in conf for r in routes) and '"max_payload": 8388608' in conf and '"store_dir": "/data"' in conf
    for name, c in containers(default_docs).items():
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert yaml.safe_load(env["JETRL__NATS__SERVERS"]) == [r.replace(":6222", ":4222") for r in routes], name
        assert env["JETRL__STREAMS__REPLICAS"] == "3"


def test_services_probes_storage_secrets_and_scaling(default_docs):
    deps, sts = by_kind(default_docs, "Deployment"), by_kind(default_docs, "StatefulSet")
    assert {"rl-jetrl-rollout", "rl-jetrl-reward"} <= set(deps)
    assert {"rl-jetrl-controller", "rl-jetrl-weights", "rl-jetrl-trainer"} <= set(sts)
    assert deps["rl-jetrl-rollout"]["spec"]["replicas"] == 2
    for name, c in containers(default_docs).items():
        assert c["livenessProbe"]["httpGet"] and c["readinessProbe"]["httpGet"], name
        secret_env = [e for e in c["env"] if "valueFrom" in e]
        assert {e["name"] for e in secret_env} >= {"JETRL__CONTROLLER__TOKEN", "JETRL__WEIGHTS__TOKEN"}
    assert containers(default_docs)["controller"]["livenessProbe"]["httpGet"]["path"] == "/v1/health"
    assert containers(default_docs)["weights"]["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "rl-jetrl-weights" in by_kind(default_docs, "PersistentVolumeClaim")
    assert "rl-jetrl-secrets" in by_kind(default_docs, "Secret")
    gpu = containers(render({"rollout": {"gpus": 1}, "trainer": {"gpus": 4}}))
    assert gpu["rollout"]["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert gpu["trainer"]["resources"]["limits"] == {"nvidia.com/gpu": 4}
    assert "limits" not in containers(default_docs)["rollout"]["resources"]
    own = render({"secrets": {"existingSecret": "mine"}, "nats": {"jetrlSecret": "mine"}})
    assert "rl-jetrl-secrets" not in by_kind(own, "Secret")
    assert {e["valueFrom"]["secretKeyRef"]["name"] for e in containers(own)["trainer"]["env"] if "valueFrom" in e} == {
        "mine"}


def test_without_the_nats_chart_external_servers_are_required():
    with pytest.raises(helm.HelmError, match="externalNats.servers"):
        render({"nats": {"enabled": False}})
    docs = render({"nats": {"enabled": False}, "externalNats": {"servers": ["nats://a:4222", "nats://b:4222"]}})
    assert not any(d["metadata"]["name"].endswith("-nats") for d in docs)
    env = {e["name"]: e.get("value") for e in containers(docs)["rollout"]["env"]}
    assert yaml.safe_load(env["JETRL__NATS__SERVERS"]) == ["nats://a:4222", "nats://b:4222"]


@pytest.mark.parametrize("name", ["controller", "weights", "reward", "rollout", "trainer"])
def test_each_container_runs_a_real_subcommand_on_a_config_that_loads(default_docs, tmp_path, name):
    c = containers(default_docs)[name]
    args = list(c["args"])
    sub = args[: args.index("-c")]
    r = subprocess.run([sys.executable, "-m", "launcher.cli", *sub, "--help"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    run_yaml = by_kind(default_docs, "ConfigMap")["rl-jetrl-run"]["data"]["run.yaml"]
    path = tmp_path / "run.yaml"
    path.write_text(run_yaml)
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    cfg = load_config(JetrlConfig, str(path), env=env)
    assert cfg.weights.url == "http://rl-jetrl-weights:8700" and cfg.streams.replicas == 3
    if name != "weights":  # its own NATS user; the streams are the controller's
        assert cfg.nats.user == f"jetrl-{NATS_ROLE[name]}" and cfg.streams.manage is (name == "controller")
    assert cfg.run == "demo"


def test_the_chart_version_is_the_package_version():
    from shared import __version__

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (__version__, __version__)


# --- per-service NATS users (shared/runtime/nats_permissions.py) ----------------------------------------
from shared.runtime.nats_permissions import ROLES, env_var, permissions  # noqa: E402

# the NATS user each jetrl container connects as (the weight store does not use NATS)
NATS_ROLE = {"controller": "controller", "rollout": "rollout", "reward": "reward", "trainer": "trainer"}


def nats_conf(docs) -> str:
    return by_kind(docs, "ConfigMap")["rl-nats-config"]["data"]["nats.conf"]


def conf_users(conf: str) -> dict[str, dict]:
    """{user: entry} of the rendered nats.conf (the NATS chart writes JSON with variable references and sizes
    such as 10Gi bare: quoted here to parse it)."""
    import json
    import re

    data = json.loads(re.sub(r":\s*(\$[A-Z_]+|\d+[A-Za-z]+)(?=,?\n)", r': "\1"', conf))
    return {u["user"]: u for u in data["authorization"]["users"]}


def secret_ref(env: dict) -> tuple[str, str]:
    ref = env["valueFrom"]["secretKeyRef"]
    return ref["name"], ref["key"]


def test_the_chart_values_hold_the_permissions_table_as_it_is_now():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["nats"]["jetrlPermissions"] == {r: permissions(r, "*") for r in ROLES}, (
        "deploy/helm/jetrl/values.yaml nats.jetrlPermissions is out of date: paste `jetrl nats-config --helm`")
    assert values["nats"]["perServiceUsers"] is True


def test_the_nats_config_holds_every_role_s_permissions_exactly(default_docs):
    users = conf_users(nats_conf(default_docs))
    assert set(users) == {f"jetrl-{r}" for r in ROLES}
    for role in ROLES:
        u = users[f"jetrl-{role}"]
        assert u["password"] == f"${env_var(role)}", role  # read by the server from its environment
        assert u["permissions"] == permissions(role, "*"), role
    # the run-scoped values `jetrl nats-config --helm --run r1` prints scope the server's users to r1
    r = subprocess.run([sys.executable, "-m", "launcher.cli", "nats-config", "--helm", "--run", "r1"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    scoped = conf_users(nats_conf(render(yaml.safe_load(r.stdout))))
    assert all(scoped[f"jetrl-{role}"]["permissions"] == permissions(role, "r1") for role in ROLES)


def test_each_service_is_its_own_nats_user_and_only_the_controller_manages_streams(default_docs):
    secret = by_kind(default_docs, "Secret")["rl-jetrl-secrets"]["stringData"]
    for name, c in containers(default_docs).items():
        env = {e["name"]: e for e in c["env"]}
        assert "JETRL__NATS__TOKEN" not in env, name  # no shared identity next to the user's
        role = NATS_ROLE.get(name)
        if role is None:
            assert not {"JETRL__NATS__USER", "JETRL__NATS__PASSWORD"} & set(env), name
            continue
        assert env["JETRL__NATS__USER"]["value"] == f"jetrl-{role}", name
        assert secret_ref(env["JETRL__NATS__PASSWORD"]) == ("rl-jetrl-secrets", f"nats-password-{role}"), name
        assert "optional" not in env["JETRL__NATS__PASSWORD"]["valueFrom"]["secretKeyRef"], name
        assert env["JETRL__STREAMS__MANAGE"]["value"] == ("true" if role == "controller" else "false"), name
    # one generated password per role, all different
    pws = {r: secret[f"nats-password-{r}"] for r in ROLES}
    assert all(len(p) == 33 and p[0].isalpha() and p.isalnum() for p in pws.values()) and len(set(pws.values())) == len(ROLES)
    # the NATS server reads every role's password from the same Secret; nats-box is the admin
    nats_env = {e["name"]: e for e in by_kind(default_docs, "StatefulSet")["rl-nats"]["spec"]["template"]["spec"][
        "containers"][0]["env"]}
    assert {k: secret_ref(v) for k, v in nats_env.items() if k.startswith("JETRL_NATS_")} == {
        env_var(r): ("rl-jetrl-secrets", f"nats-password-{r}") for r in ROLES}
    box = {e["name"]: e for e in by_kind(default_docs, "Deployment")["rl-nats-box"]["spec"]["template"]["spec"][
        "containers"][0]["env"]}
    assert box["NATS_USER"]["value"] == "jetrl-admin"
    assert secret_ref(box["NATS_PASSWORD"]) == ("rl-jetrl-secrets", "nats-password-admin")


def test_given_passwords_existing_secret_external_nats_and_the_opt_out():
    given = render({"secrets": {"natsPasswords": {"rollout": "pw-rollout-given"}}})
    assert by_kind(given, "Secret")["rl-jetrl-secrets"]["stringData"]["nats-password-rollout"] == "pw-rollout-given"
    # nats-server parses a value it reads from the environment: one starting with a digit or "-" is refused here
    for bad in ("1-2pw", "-pw"):
        with pytest.raises(helm.HelmError, match="natsPasswords.rollout"):
            render({"secrets": {"natsPasswords": {"rollout": bad}}})
    # an existing Secret: the bundled NATS chart must be pointed at it too, or the chart refuses
    with pytest.raises(helm.HelmError, match="nats.jetrlSecret"):
        render({"secrets": {"existingSecret": "mine"}})
    own = render({"secrets": {"existingSecret": "mine"}, "nats": {"jetrlSecret": "mine"}})
    assert "rl-jetrl-secrets" not in by_kind(own, "Secret")
    nats_env = by_kind(own, "StatefulSet")["rl-nats"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {secret_ref(e)[0] for e in nats_env if e["name"].startswith("JETRL_NATS_")} == {"mine"}
    assert secret_ref({e["name"]: e for e in containers(own)["rollout"]["env"]}["JETRL__NATS__PASSWORD"])[0] == "mine"
    # external NATS: no NATS chart, every service still connects as its own user (docs/deploy.md)
    ext = render({"nats": {"enabled": False}, "externalNats": {"servers": ["nats://n1:4222"]}})
    assert "rl-nats-config" not in by_kind(ext, "ConfigMap")
    for name, role in NATS_ROLE.items():
        env = {e["name"]: e for e in containers(ext)[name]["env"]}
        assert env["JETRL__NATS__USER"]["value"] == f"jetrl-{role}"
    assert all(f"nats-password-{r}" in by_kind(ext, "Secret")["rl-jetrl-secrets"]["stringData"] for r in ROLES)
    # opt-out: one token for every service, as before per-service users
    old = render({"nats": {"perServiceUsers": False}, "secrets": {"natsToken": "t"}})
    assert '"authorization"' not in nats_conf(old)
    assert not any(k.startswith("nats-password-") for k in by_kind(old, "Secret")["rl-jetrl-secrets"]["stringData"])
    nats_env = by_kind(old, "StatefulSet")["rl-nats"]["spec"]["template"]["spec"]["containers"][0]["env"]
    assert not any(e["name"].startswith("JETRL_NATS_") for e in nats_env)
    for name, c in containers(old).items():
        env = {e["name"]: e for e in c["env"]}
        assert secret_ref(env["JETRL__NATS__TOKEN"]) == ("rl-jetrl-secrets", "nats-token"), name
        assert not {"JETRL__NATS__USER", "JETRL__NATS__PASSWORD", "JETRL__STREAMS__MANAGE"} & set(env), name


async def test_the_rendered_nats_config_runs_and_enforces_the_users(tmp_path):
    """The chart's own nats.conf (one node, ports and paths moved into tmp_path by values) in a real
    nats-server, passwords from the environment as the chart's Secret gives them to the NATS container."""
    import asyncio
    import os

    import nats

    from shared.runtime.natsd import free_port, nats_server_binary

    port, mport = free_port(), free_port()
    docs = render({"nats": {"config": {
        "cluster": {"enabled": False}, "nats": {"port": port}, "monitor": {"port": mport},
        "jetstream": {"fileStore": {"dir": str(tmp_path / "js")}},
        "merge": {"host": "127.0.0.1", "pid_file": str(tmp_path / "nats.pid")}}}})
    conf = tmp_path / "nats.conf"
    conf.write_text(nats_conf(docs))
    pws = by_kind(docs, "Secret")["rl-jetrl-secrets"]["stringData"]
    env = {**os.environ, "SERVER_NAME": "rl-nats-0", **{env_var(r): pws[f"nats-password-{r}"] for r in ROLES}}
    proc = subprocess.Popen([nats_server_binary(), "-c", str(conf)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=env)
    url = f"nats://127.0.0.1:{port}"

    async def connect(role: str, **kw):
        return await nats.connect(url, connect_timeout=1, allow_reconnect=False, user=f"jetrl-{role}",
                                  password=pws[f"nats-password-{role}"], **kw)

    try:
        admin = None
        for _ in range(100):
            try:
                admin = await connect("admin")
                break
            except Exception:
                assert proc.poll() is None, proc.stderr.read().decode()
                await asyncio.sleep(0.1)
        assert admin is not None, "nats-server with the chart's nats.conf did not start"
        assert admin.max_payload == 8 * 1024 * 1024
        await admin.close()
        for role in ROLES:  # every role's user exists with its Secret password
            await (await connect(role)).close()
        ctl = await connect("controller")
        from shared.config import StreamsConfig
        from shared.contract import bus

        await bus.ensure_streams(ctl.jetstream(), StreamsConfig(duplicate_window_s=120))  # the controller may
        await ctl.close()
        errors = []

        async def on_error(exc):
            errors.append(str(exc))

        w = await connect("rollout", error_cb=on_error)
        with pytest.raises(Exception):  # noqa: B017 - the request is dropped: a timeout
            await w.jetstream(timeout=1).delete_stream("PROMPTS")
        await w.close()
        assert any("permissions violation" in e.lower() and "stream.delete" in e.lower() for e in errors), errors
        with pytest.raises(Exception):  # noqa: B017 - a wrong password is refused
            await nats.connect(url, connect_timeout=1, allow_reconnect=False, user="jetrl-rollout",
                               password=pws["nats-password-trainer"])
    finally:
        proc.kill()
        proc.wait()
