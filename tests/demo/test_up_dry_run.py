"""`jetrl up --dry-run`: the resolved config (free ports, state inside the run dir, NATS as a server to
connect to) and one command per process, nothing started."""

import subprocess
import sys

import yaml

from launcher.plan import UpOptions, plan, resolve_config
from shared.config import JetrlConfig, load_config


def _cfg(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return load_config(JetrlConfig, str(p), [])


def test_dry_run_prints_every_process_and_the_resolved_config_and_writes_nothing(tmp_path):
    (tmp_path / "c.yaml").write_text("run: dry\nnats: {embedded: true}\nreward: {task: maxdigit}\n")
    out = subprocess.run([sys.executable, "-m", "launcher.cli", "up", "-c", str(tmp_path / "c.yaml"), "--dry-run",
                          "--run-dir", str(tmp_path / "run"), "--workers", "2"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    procs, ports = out.stdout.split("# processes")[1].split("# metrics ports")
    names = [line.split(":")[0] for line in procs.strip().splitlines()]
    assert names == ["nats", "controller", "weights", "reward", "rollout-0", "rollout-1", "trainer"]
    assert not (tmp_path / "run").exists()  # a dry run writes nothing: no run dir, config or secret file
    child = yaml.safe_load(out.stdout.split("# processes")[0].split("\n", 1)[1])
    assert child["nats"]["embedded"] is False
    port = int(child["nats"]["servers"][0].rsplit(":", 1)[1])
    assert f"--port {port}" in out.stdout
    assert child["controller"]["url"] == f"http://127.0.0.1:{child['controller']['port']}"
    assert child["controller"]["db_url"] == f"sqlite:///{tmp_path / 'run' / 'controller.db'}"
    assert child["weights"]["root"] == str(tmp_path / "run" / "weights")
    assert "--resume" in out.stdout
    metrics = dict(line.split(": ") for line in ports.strip().splitlines()[1:])
    assert set(metrics) == {"reward", "rollout-0", "rollout-1", "trainer"}
    for name, port in metrics.items():
        assert f"{name}: " in procs and f"telemetry.metrics_port={port}" in procs


def test_metrics_ports_are_fixed_by_default_and_move_only_when_taken(tmp_path):
    import socket

    from launcher.metrics_ports import MetricsPortError, assign_metrics_ports

    def specs(text):
        r = resolve_config(_cfg(tmp_path, text), tmp_path / "run")
        s = plan(r, tmp_path / "run" / "config.yaml", UpOptions(run_dir=tmp_path / "run", workers=2,
                                                                reward_replicas=2))
        return s, r.telemetry

    def bindable(port):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
                return True
            except OSError:
                return False

    # A block below the kernel's ephemeral range (32768-60999 here: any outgoing connection may hold a port
    # there; CI once found 51020 taken) whose five ports are free now.
    start = hash(str(tmp_path)) % 120
    free_base = next(b for k in range(120) if all(bindable((b := 20000 + ((start + k) % 120) * 100) + off)
                                                   for off in (1, 10, 11, 20, 21)))
    s, tel = specs(f"run: mp\ntelemetry: {{metrics_base_port: {free_base}}}\n")
    ports = assign_metrics_ports(s, tel)
    b = free_base
    assert ports == {"reward-0": b + 10, "reward-1": b + 11, "rollout-0": b + 20, "rollout-1": b + 21, "trainer": b + 1}
    assert f"telemetry.metrics_port={b + 1}" in next(x for x in s if x.name == "trainer").argv
    with socket.socket() as taken:  # an explicit base that is taken: refused, naming the field and the port
        taken.bind(("127.0.0.1", b + 1))
        s, tel = specs(f"run: mp\ntelemetry: {{metrics_base_port: {b}}}\n")
        try:
            assign_metrics_ports(s, tel)
            raise AssertionError("a taken explicit metrics port was accepted")
        except MetricsPortError as exc:
            assert "telemetry.metrics_base_port" in str(exc) and str(b + 1) in str(exc)
    s, tel = specs("run: mp\ntelemetry: {metrics_port: -1}\n")
    assert assign_metrics_ports(s, tel) == {} and not any("telemetry.metrics_port=" in " ".join(x.argv) for x in s)
    s, tel = specs("run: mp\n")  # the default: 9400 + offsets, or the next free block of 100
    ports = assign_metrics_ports(s, tel)
    assert (ports["trainer"] - 9401) % 100 == 0 and ports["rollout-1"] - ports["trainer"] == 20


def test_explicit_ports_and_paths_are_kept(tmp_path):
    cfg = _cfg(tmp_path, "run: keep\ncontroller: {port: 18600, db_url: 'sqlite:////tmp/x.db'}\n"
                         "weights: {port: 18700, root: /tmp/w}\n")
    r = resolve_config(cfg, tmp_path / "run")
    assert (r.controller.port, r.controller.db_url) == (18600, "sqlite:////tmp/x.db")
    assert (r.weights.port, r.weights.root, r.weights.url) == (18700, "/tmp/w", "http://127.0.0.1:18700")
    assert r.nats.servers == ["nats://127.0.0.1:4222"]  # not embedded: connect to the given servers
    names = [s.name for s in plan(r, tmp_path / "run" / "config.yaml", UpOptions(run_dir=tmp_path / "run"))]
    assert "nats" not in names


def test_eval_follower_is_planned_when_asked_for(tmp_path):
    cfg = _cfg(tmp_path, "run: ev\n")
    (tmp_path / "h.jsonl").write_text('{"prompt": "max 1 2 3 4 5 =", "reference": "5"}\n')
    opts = UpOptions(run_dir=tmp_path / "run", eval_dataset=str(tmp_path / "h.jsonl"), eval_every=3)
    ev = [s for s in plan(resolve_config(cfg, opts.run_dir), tmp_path / "c.yaml", opts) if s.name == "eval"]
    assert ev and ev[0].argv[-4:] == ["--dataset", str(tmp_path / "h.jsonl"), "--every", "3"]


def test_tracker_sink_is_planned_when_tracking_is_enabled(tmp_path):
    from launcher.metrics_ports import assign_metrics_ports

    r = resolve_config(_cfg(tmp_path, "run: tr\ntracking: {enabled: true, to: wandb}\n"), tmp_path / "run")
    assert r.tracking.dir == str((tmp_path / "run" / "tracking").resolve())
    specs = plan(r, tmp_path / "run" / "config.yaml", UpOptions(run_dir=tmp_path / "run"))
    track = next(s for s in specs if s.name == "track")
    assert track.argv[-3:] == ["track", "-c", str(tmp_path / "run" / "config.yaml")]
    ports = assign_metrics_ports(specs, r.telemetry)
    assert ports["track"] - ports["trainer"] == 2  # base + 3
    off = resolve_config(_cfg(tmp_path, "run: tr\n"), tmp_path / "run2")
    assert "track" not in [s.name for s in plan(off, tmp_path / "c.yaml", UpOptions(run_dir=tmp_path / "run2"))]


def test_endpoints_list_names_the_dashboard_every_metrics_url_and_nats(tmp_path):
    from launcher.up import Launcher, endpoints_text

    cfg = _cfg(tmp_path, "run: ep\nnats: {embedded: true}\ntelemetry: {metrics_base_port: 0}\n")
    launcher = Launcher(cfg, UpOptions(run_dir=tmp_path / "run", workers=2), console=None)
    text = endpoints_text(launcher)
    c = launcher.resolved.controller
    assert f"dashboard           {c.url}/#token=<the token in {tmp_path / 'run' / 'secrets' / 'controller.token'}>" in text
    assert f"controller metrics  {c.url}/metrics" in text and f"{launcher.resolved.weights.url}/metrics" in text
    for name, port in launcher.metrics_ports.items():
        assert f"{name} metrics" in text and f"http://127.0.0.1:{port}/metrics" in text
    assert set(launcher.metrics_ports) == {"reward", "rollout-0", "rollout-1", "trainer"}
    assert launcher.resolved.nats.servers[0] in text
