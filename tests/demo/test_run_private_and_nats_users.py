"""A short real `jetrl demo`: every service connects as its own NATS user scoped
to the run (no permission violation in any log, no child's command line holds a password), and nothing
the run writes under its run dir is readable by group or others (0700 dirs, 0600 files), unless
launch.private_files is false."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _open_to_others(root: Path) -> list[str]:
    out = []
    for dirpath, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            p = Path(dirpath) / name
            st = p.lstat()
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
                out.append(f"{oct(stat.S_IMODE(st.st_mode))} {p.relative_to(root)}")
    return out


def test_short_demo_run_dir_is_private_and_each_service_has_its_own_nats_user(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "demo", "--out", str(out), "--steps", "8",
                           "--eval-every", "4", "--minutes", "3", "--no-panel"],
                          capture_output=True, text=True, timeout=600,
                          preexec_fn=lambda: os.umask(0o022))  # the usual shell umask: files 0644 without the fix
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = (out / "runs").iterdir()
    run = run_dir.name
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    for sub in ("logs", "data", "weights", "checkpoints", "nats", "secrets"):
        assert (run_dir / sub).is_dir(), sub
    assert _open_to_others(run_dir) == []
    assert stat.S_IMODE((out / "summary.json").stat().st_mode) == 0o600
    # per-service NATS users, scoped to the run, and nothing refused on the way
    logs = {p.name: p.read_text(errors="replace") for p in (run_dir / "logs").glob("*.log")}
    assert {"controller.log", "rollout.log", "reward.log", "trainer.log", "eval.log"} <= set(logs)
    for name, text in logs.items():
        assert "permissions violation" not in text.lower(), name
    conf = (run_dir / "nats" / "nats-server.conf").read_text()
    for role in ("admin", "controller", "rollout", "reward", "trainer", "tracker", "eval"):
        assert f'user: "jetrl-{role}"' in conf, role
    assert f'"jetrl.{run}.trajectories"' in conf and '"jetrl.*.trajectories"' not in conf
    users = run_dir / "secrets" / "nats"
    passwords = {p.read_text().strip() for p in users.glob("*.password")}
    assert len(passwords) == 8 and all(len(p) >= 32 for p in passwords)
    assert not any(pw in proc.stdout + proc.stderr for pw in passwords)


def test_private_files_false_keeps_the_shells_umask(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("run: open\nnats: {embedded: true}\nreward: {task: maxdigit}\nlaunch: {private_files: false}\n")
    # what `jetrl up` writes before it starts anything (the run dir, config.yaml, the secrets)
    start = ("import sys; from pathlib import Path; from launcher.plan import UpOptions, write_resolved; "
             "from shared.config import JetrlConfig, load_config; "
             "write_resolved(load_config(JetrlConfig, sys.argv[1], []), UpOptions(run_dir=Path(sys.argv[2])))")
    proc = subprocess.run([sys.executable, "-c", start, str(cfg), str(tmp_path / "run")], capture_output=True,
                          text=True, timeout=120, preexec_fn=lambda: os.umask(0o022))
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE((tmp_path / "run").stat().st_mode) == 0o755
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "up", "-c", str(cfg), "--dry-run", "--run-dir",
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: os.umask(0o022))
    assert proc.returncode == 0, proc.stderr
    # the dry run shows each service's NATS identity: a user and its password's file, never a password
    procs = proc.stdout.split("# processes")[1]
    assert "nats.user=jetrl-rollout" in procs and "nats.user=jetrl-trainer" in procs
    assert "streams.manage=false" in procs
    assert "--users-dir" in procs and "--run open" in procs
    for f in (tmp_path / "run" / "secrets" / "nats").glob("*.password"):
        assert f.read_text().strip() not in proc.stdout
        assert stat.S_IMODE(f.stat().st_mode) == 0o600  # secrets stay private either way


def test_one_shared_nats_user_only_when_asked(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("run: shared\nnats: {embedded: true, per_service_users: false}\nreward: {task: maxdigit}\n")
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "up", "-c", str(cfg), "--dry-run", "--run-dir",
                           str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    procs = proc.stdout.split("# processes")[1]
    assert "--user jetrl --password-file" in procs and "--users-dir" not in procs
    assert "nats.user=" not in procs and "streams.manage=false" not in procs
