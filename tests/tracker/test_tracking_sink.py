"""`jetrl track`: the sink reads only the bus (EVENTS and TRAJECTORIES, ordered consumers) and writes the
documented scalars to real trackers: TensorBoard event files read back with tensorboard's reader, a
wandb offline run dir, a trackio project read back with trackio's storage."""

from __future__ import annotations

import asyncio
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shared.contract import bus, subjects
from shared.contract.messages import TRAINER_STAGES, Event, Sample, TrajectoryGroup
from tracker.scalars import RolloutStats, WorkerGauges, event_scalars

ROOT = Path(__file__).resolve().parents[2]
RUN = "trk"


def sample(version: int, reward: float, gen: int = 3, tool: int = 0, finish: str = "stop") -> Sample:
    n = 4 + gen + tool
    mask = np.array([0] * 4 + [1] * gen + [0] * tool, np.uint8)
    return Sample(tokens=np.arange(n, dtype=np.int32), loss_mask=mask, logprobs=np.zeros(n, np.float32),
                  versions=np.where(mask == 1, version, -1).astype(np.int32), prompt_len=4, reward=reward,
                  finish_reason=finish)


def group(i: int, version: int, rewards: list[float]) -> TrajectoryGroup:
    return TrajectoryGroup(run=RUN, prompt_id=f"p{i}", epoch=0, samples=[sample(version, r) for r in rewards])


def step_event(v: int) -> Event:
    t = dict.fromkeys(TRAINER_STAGES, 0.0)
    t.update(forward=0.5 * v, backward=1.0)
    return Event(run=RUN, service="trainer", kind="step", data={
        "version": v, "step": v, "loss": 1.0 / v, "reward_mean": 0.25 * v, "tokens_per_s": 100.0 * v,
        "staleness_hist": {"0": 3, "2": 1}, "wall_s": 1.5 + 0.5 * v, "timings": t,
        "rollout_timings": {"generate": 2.0, "reward": 0.5, "tools": 0.0, "queue_wait": 1.0}})


def test_event_scalars_use_the_documented_names():
    v, s = event_scalars(step_event(2))
    assert v == 2
    assert s["train/loss"] == 0.5 and s["train/reward_mean"] == 0.5 and s["train/tokens_per_s"] == 200.0
    assert s["train/staleness_mean"] == pytest.approx(0.5)  # (0*3 + 2*1) / 4
    assert s["time/trainer/forward"] == 1.0 and s["time/step_wall_s"] == 2.5 and s["time/rollout/generate"] == 2.0
    ev = Event(run=RUN, service="eval", kind="eval", data={"version": 4, "reward": 0.75, "pass_at_1": 0.75})
    assert event_scalars(ev) == (4, {"eval/reward": 0.75, "eval/pass_at_1": 0.75})
    ev = Event(run=RUN, service="rollout", kind="weights", data={"version": 3, "fetch_s": 0.25, "swap_s": 0.125})
    assert event_scalars(ev) == (3, {"time/weights/fetch": 0.25, "time/weights/swap": 0.125})
    assert event_scalars(Event(run=RUN, service="trainer", kind="health", data={"version": 1})) is None
    g = WorkerGauges()
    g.update(Event(run=RUN, service="rollout", kind="metrics", instance="a", data={"tokens_per_s": 10.0, "version_lag": 1}))
    got = g.update(Event(run=RUN, service="rollout", kind="metrics", instance="b",
                         data={"tokens_per_s": 30.0, "version_lag": 0}))
    assert got == {"rollout/tokens_per_s": 40.0, "rollout/version_lag": 1.0}


def test_rollout_stats_close_a_version_when_a_newer_one_arrives():
    st = RolloutStats()
    assert st.add(group(0, 0, [1.0, 0.0])) == []
    g = group(1, 0, [1.0, 1.0])
    g.samples[0] = sample(0, 1.0, gen=3, tool=2, finish="length")
    assert st.add(g) == []
    (v, s), = st.add(group(2, 1, [0.5, 0.5]))
    assert v == 0
    assert s["rollouts/reward_mean"] == 0.75 and s["rollouts/reward_std"] == pytest.approx(np.std([1, 0, 1, 1]))
    assert s["rollouts/truncated_frac"] == 0.25 and s["rollouts/tool_tokens_mean"] == 0.5
    assert s["rollouts/groups"] == 2 and s["rollouts/samples"] == 4 and s["rollouts/response_tokens_mean"] == 3
    assert [v for v, _ in st.flush()] == [1]


async def publish_run(js, nc) -> None:
    for v in (1, 2, 3):
        await bus.publish(js, nc, subjects.events(RUN, "trainer"), step_event(v))
    await bus.publish(js, nc, subjects.events(RUN, "eval"),
                      Event(run=RUN, service="eval", kind="eval", data={"version": 3, "reward": 0.75}))
    await bus.publish(js, nc, subjects.events(RUN, "rollout"),
                      Event(run=RUN, service="rollout", kind="weights", data={"version": 2, "fetch_s": 0.25,
                                                                              "swap_s": 0.125}))
    for i, (v, rewards) in enumerate([(0, [1.0, 0.0]), (0, [0.0, 0.0]), (1, [1.0, 1.0])]):
        g = group(i, v, rewards)
        await bus.publish(js, nc, subjects.trajectories(RUN), g, msg_id=g.group_id)


def track(nats_url: str, to: str, out: Path, env: dict | None = None) -> str:
    cmd = [sys.executable, "-m", "launcher.cli", "track", "--to", to, "--dir", str(out), "--until-idle", "2",
           f"run={RUN}", f"nats.servers=[{nats_url}]", "telemetry.metrics_port=-1", "tracking.flush_every_s=0.5"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180,
                       env=dict(os.environ, WANDB_SILENT="true", **(env or {})))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return p.stdout


async def test_tensorboard_event_files_hold_what_was_on_the_bus(nats_server, js, nc, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    await publish_run(js, nc)
    out = await asyncio.to_thread(track, nats_server.url, "tensorboard", tmp_path / "tb")
    assert f"(nice {min(19, os.nice(0) + 10)})" in out  # tracking.nice: the observer yields the CPU to training
    ea = EventAccumulator(str(tmp_path / "tb" / RUN), size_guidance={"tensors": 0})
    ea.Reload()

    def series(tag):
        return [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in ea.Tensors(tag)]

    assert series("train/loss") == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]
    assert series("train/reward_mean") == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert series("time/trainer/forward") == [(1, 0.5), (2, 1.0), (3, 1.5)]
    assert series("time/step_wall_s") == [(1, 2.0), (2, 2.5), (3, 3.0)]
    assert series("eval/reward") == [(3, 0.75)]
    assert series("time/weights/fetch") == [(2, 0.25)]
    assert series("rollouts/reward_mean") == [(0, 0.25), (1, 1.0)]  # version 1 written when the sink stopped
    assert series("rollouts/samples") == [(0, 4.0), (1, 2.0)]
    # what TensorBoard's scalars dashboard shows: every tag carries the scalars plugin's metadata
    for tag in ea.Tags()["tensors"]:
        assert ea.SummaryMetadata(tag).plugin_data.plugin_name == "scalars", tag


async def test_wandb_offline_run_dir_is_written_without_a_network(nats_server, js, nc, tmp_path):
    await publish_run(js, nc)
    await asyncio.to_thread(track, nats_server.url, "wandb", tmp_path / "wb",
                            {"WANDB_MODE": "offline", "WANDB_DISABLE_GIT": "true"})
    runs = glob.glob(str(tmp_path / "wb" / "wandb" / "offline-run-*"))
    assert len(runs) == 1, os.listdir(tmp_path / "wb")
    data = Path(glob.glob(f"{runs[0]}/run-*.wandb")[0]).read_bytes()
    for key in (b"train/loss", b"time/trainer/forward", b"rollouts/reward_mean", b"eval/reward", b"version"):
        assert key in data  # the history records (protobuf) carry the scalar names


async def test_trackio_project_is_read_back_with_trackios_storage(nats_server, js, nc, tmp_path):
    await publish_run(js, nc)
    out = tmp_path / "trackio"
    await asyncio.to_thread(track, nats_server.url, "trackio", out)
    read = ("import json; from trackio.sqlite_storage import SQLiteStorage; "
            f"print(json.dumps(SQLiteStorage.get_logs('jetrl', '{RUN}')))")
    p = subprocess.run([sys.executable, "-c", read], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, TRACKIO_DIR=str(out)))
    assert p.returncode == 0, p.stderr[-2000:]
    logs = json.loads(p.stdout.strip().splitlines()[-1])
    loss = sorted((r["step"], r["train/loss"]) for r in logs if "train/loss" in r)
    assert loss == [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))]
    assert sorted((r["step"], r["rollouts/reward_mean"]) for r in logs if "rollouts/reward_mean" in r) == [(0, 0.25),
                                                                                                          (1, 1.0)]


def test_the_judges_criteria_reach_the_step_event_and_the_tracker():
    from trainer_service.metrics import judge_metric_means

    samples = [sample(1, 0.5), sample(1, 1.0), sample(1, 0.0)]
    samples[0].metrics = {"reward_criterion/polite": 0.25, "reward_criterion/helpful": 1.0, "reward_error": "x"}
    samples[1].metrics = {"reward_criterion/polite": 0.75, "reward_format": 1, "reward_pairwise/win_rate": 0.5}
    samples[2].metrics = {"reward_criterion/polite": True}  # not a score: left out
    means = judge_metric_means(samples)
    assert means == {"reward_criterion/helpful": 1.0, "reward_criterion/polite": 0.5,
                     "reward_pairwise/win_rate": 0.5}
    ev = step_event(3)
    ev.data.update(means)
    _, s = event_scalars(ev)
    assert s["train/reward_criterion/polite"] == 0.5 and s["train/reward_pairwise/win_rate"] == 0.5
