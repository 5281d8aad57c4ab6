"""trainer.publish_overlap: version v uploads while the next step trains; versions still go out in order,
one at a time, a checkpoint waits for the version it names, and a failed upload fails the trainer.
In-process Trainer on the sim backend with a publisher that takes 0.6 s per version."""

from __future__ import annotations

import asyncio
import time

import pytest
from trainer_testlib import make_group, publish_groups, read_events, steps, trainer_overrides

from shared.config import JetrlConfig, load_config
from trainer_service import publish as publish_mod
from trainer_service import service
from trainer_service.backends import make_backend

UPLOAD_S = 0.6


class SlowPublisher:
    """The directory publisher, 0.6 s slower, logging (what, version, perf_counter)."""

    def __init__(self, cfg, js, log, fail_at=None):
        self.inner, self.log, self.fail_at = publish_mod.DirectoryPublisher(cfg, js), log, fail_at

    async def latest(self):
        return await self.inner.latest()

    async def publish(self, version, step, state_dict, hf_config, tokenizer, metadata=None):
        self.log.append(("publish_start", version, time.perf_counter()))
        await asyncio.sleep(UPLOAD_S)
        if version == self.fail_at:
            raise ValueError(f"bad version {version}")  # not retryable
        wv = await self.inner.publish(version, step, state_dict, hf_config, tokenizer, metadata)
        self.log.append(("publish_end", version, time.perf_counter()))
        return wv

    async def close(self):
        await self.inner.close()


async def _serve(nats_server, js, nc, tmp_path, run, monkeypatch, overlap: bool, fail_at=None,
                 checkpoint_every=2):
    cfg = load_config(JetrlConfig, None, trainer_overrides(
        nats_server.url, tmp_path, run, **{"trainer.backend": "sim", "trainer.device": "cpu",
                                           "trainer.sim.step_base_s": 0.3, "trainer.sim.s_per_sample": 0,
                                           "trainer.sim.s_per_token": 0, "schedule.total_steps": 4,
                                           "trainer.checkpoint_every": checkpoint_every,
                                           "trainer.publish_overlap": str(overlap).lower()}))
    log: list[tuple[str, int, float]] = []
    monkeypatch.setattr(service, "make_publisher", lambda c, j: SlowPublisher(c, j, log, fail_at))
    await publish_groups(js, nc, [make_group(run, i) for i in range(8)])
    backend = make_backend(cfg)
    real_step = backend.train_step

    def train_step(items, tcfg, norm_length):
        log.append(("step_start", 0, time.perf_counter()))
        out = real_step(items, tcfg, norm_length)
        log.append(("step_end", 0, time.perf_counter()))
        return out

    backend.train_step = train_step
    real_save = backend.save_checkpoint

    def save_checkpoint(path, extra):
        log.append(("checkpoint", int(extra["version"]), time.perf_counter()))
        real_save(path, extra)

    backend.save_checkpoint = save_checkpoint
    trainer = service.Trainer(cfg, backend)
    try:
        await asyncio.wait_for(trainer.serve(), timeout=120)
    finally:
        backend.close()
    return trainer, log


def _at(log, what, version):
    return next(t for w, v, t in log if w == what and v == version)


async def test_a_version_uploads_while_the_next_step_trains(nats_server, js, nc, tmp_path, monkeypatch):
    trainer, log = await _serve(nats_server, js, nc, tmp_path, "ovl", monkeypatch, overlap=True)
    assert trainer.step == 4 and trainer.version == 4
    starts = [v for w, v, _ in log if w == "publish_start"]
    assert starts == [0, 1, 2, 3, 4]
    step_starts = [t for w, _, t in log if w == "step_start"]
    # step 2 began while version 1 (taken after step 1) was still uploading
    assert step_starts[1] < _at(log, "publish_end", 1)
    # one at a time, in order: v+1's upload begins after v's ends
    for v in range(4):
        assert _at(log, "publish_start", v + 1) >= _at(log, "publish_end", v)
    evs = await read_events(js, "ovl")
    assert [c["version"] for c in steps(evs, "checkpoint")] == [2, 4]
    for v in (2, 4):  # a checkpoint names only an announced version: its upload had ended before
        assert _at(log, "publish_end", v) < _at(log, "checkpoint", v)
    st = steps(evs)
    assert all(s["publish_store_s"] >= 0 for s in st) and st[-1]["publish_store_s"] >= UPLOAD_S
    assert all(0 < s["rss_gb"] <= s["peak_rss_gb"] for s in st)  # memory reported with every step
    # the loop waited for publishing much less than an upload per step
    assert sum(s["timings"]["publish"] for s in st) < 4 * UPLOAD_S


async def test_without_overlap_each_step_waits_for_its_upload(nats_server, js, nc, tmp_path, monkeypatch):
    _, log = await _serve(nats_server, js, nc, tmp_path, "seq", monkeypatch, overlap=False)
    step_starts = [t for w, _, t in log if w == "step_start"]
    for v in (1, 2, 3):
        assert step_starts[v] > _at(log, "publish_end", v)


async def test_a_failed_background_upload_fails_the_trainer(nats_server, js, nc, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="bad version 2"):
        await _serve(nats_server, js, nc, tmp_path, "bad", monkeypatch, overlap=True, fail_at=2,
                     checkpoint_every=10)
