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
    own = render({"secrets": {"existingSecret": "mine"}})
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
    assert cfg.run == "demo"


def test_the_chart_version_is_the_package_version():
    from shared import __version__

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (__version__, __version__)
