"""`jetrl up` guards against crash loops: a child that fails N times within T stops the run with its last
error lines; a config that cannot run on this host fails before anything starts, naming the field."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher.preflight import preflight
from launcher.supervisor import ProcessSpec, Supervisor
from shared.config import JetrlConfig, load_config

ROOT = Path(__file__).resolve().parents[2]


async def test_a_child_failing_n_times_within_the_window_is_given_up_with_its_last_lines(tmp_path):
    crash = ProcessSpec("trainer", [sys.executable, "-c", "import sys; print('line one'); print('', flush=True); "
                                    "print('ValueError: trainer.device: cuda requested'); sys.exit(3)"])
    ok = ProcessSpec("steady", [sys.executable, "-c", "import time; time.sleep(60)"])
    sup = Supervisor([crash, ok], tmp_path, echo=False, crash_loop_restarts=3, crash_loop_window_s=60, error_lines=2)
    await sup.start()
    try:
        import asyncio

        failure = await asyncio.wait_for(sup.wait_failure(), 30)  # back-off 1 s + 2 s between the three runs
        assert failure.name == "trainer" and failure.failures == 3 and failure.last_exit == 3
        assert failure.lines == ["line one", "ValueError: trainer.device: cuda requested"]  # blank lines skipped
        msg = failure.message()
        assert "trainer failed 3 times within 60s" in msg and msg.endswith("cuda requested")
        st = sup.status()
        assert st["trainer"]["crash_loop"] and st["trainer"]["restarts"] == 2 and not st["trainer"]["running"]
        assert st["steady"]["running"] and not st["steady"]["crash_loop"]
    finally:
        await sup.stop()


async def test_failures_spread_wider_than_the_window_are_not_a_crash_loop(tmp_path):
    spec = ProcessSpec("flaky", [sys.executable, "-c", "import sys; sys.exit(1)"])
    sup = Supervisor([spec], tmp_path, echo=False, crash_loop_restarts=2, crash_loop_window_s=0.5)
    await sup.start()
    try:
        import asyncio

        await asyncio.sleep(4.5)  # exits at ~0, 1, 3 s (back-off 1, 2): never two within 0.5 s
        assert sup.failure is None and sup.status()["flaky"]["restarts"] >= 2
    finally:
        await sup.stop()


def test_preflight_names_every_field_that_cannot_run_without_a_gpu():
    cfg = load_config(JetrlConfig, str(ROOT / "examples" / "gsm8k_grpo.yaml"), [])
    problems = preflight(cfg, gpus=lambda: 0)
    assert [p.split(":")[0] for p in problems] == ["trainer.device"], problems
    assert problems[0].startswith("trainer.device: cuda requested but torch sees no GPU")
    assert preflight(cfg, gpus=lambda: 1) == []
    local = load_config(JetrlConfig, None, ["rollout.device=cuda:0"])
    assert [p.split(":")[0] for p in preflight(local, gpus=lambda: 0)] == ["rollout.device"]
    vllm = load_config(JetrlConfig, None, ["rollout.engine=vllm", "rollout.vllm.start_server=true",
                                           "rollout.vllm.python=/nonexistent/python"])
    assert [p.split(":")[0] for p in preflight(vllm, gpus=lambda: 0)] == ["rollout.vllm.python"]
    two = load_config(JetrlConfig, None, ["trainer.device=cuda", "trainer.nproc=4"])
    assert preflight(two, gpus=lambda: 2) == ["trainer.nproc: 4 ranks on cuda but this host has 2 GPU(s)"]
    assert preflight(load_config(JetrlConfig, None, []), gpus=lambda: 0) == []
    mega = load_config(JetrlConfig, None, ["trainer.backend=megatron"])
    assert [p.split(":")[0] for p in preflight(mega, gpus=lambda: 0)] == ["trainer.backend"]
    nodes = load_config(JetrlConfig, None, ["trainer.nnodes=2", "trainer.master_addr=10.0.0.1"])
    assert [p.split(":")[0] for p in preflight(nodes, gpus=lambda: 0)] == ["trainer.nnodes"]


def test_jetrl_up_refuses_the_gpu_example_on_a_cpu_host_before_starting_anything(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU")
    r = subprocess.run([sys.executable, "-m", "launcher.cli", "up", "-c", str(ROOT / "examples" / "gsm8k_grpo.yaml"),
                        "--run-dir", str(tmp_path / "run"), "--no-panel"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "trainer.device: cuda requested but torch sees no GPU" in r.stdout
    assert not (tmp_path / "run" / "logs").exists()  # nothing was started


@pytest.mark.slow
def test_jetrl_up_stops_a_run_whose_trainer_crash_loops_with_its_error(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("run: loop\nnats: {embedded: true}\nreward: {task: maxdigit}\n"
                   f"model: {{path: {tmp_path / 'no-such-model'}}}\n"
                   "launch: {crash_loop_restarts: 2, crash_loop_window_s: 120, error_lines: 5}\n")
    r = subprocess.run([sys.executable, "-m", "launcher.cli", "up", "-c", str(cfg), "--run-dir", str(tmp_path / "run"),
                        "--no-panel", "--quiet"], capture_output=True, text=True, timeout=240, cwd=ROOT)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert "failed 2 times within 120s" in out and "not restarting it" in out, out[-3000:]
    assert "no-such-model" in out  # its last lines say why
