"""Helpers for the trainer tests: synthetic trajectory groups, a trainer subprocess, event readers."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from shared.contract import bus, codec, subjects
from shared.contract.messages import Event, Sample, TrajectoryGroup
from weight_store.announce import latest as latest_announced

REPO = Path(__file__).resolve().parents[2]


def save_tiny_llama(d: Path, intermediate_size: int = 96, max_position_embeddings: int = 256) -> Path:
    """A 3-layer tied Llama (hidden 48, GQA 6/2) with the test tokenizer: d/model and d/tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from shared.model.tinymodel import build_tokenizer, save_tokenizer

    tok = build_tokenizer()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=48, intermediate_size=intermediate_size, num_hidden_layers=3,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=2))
    model.save_pretrained(d / "model", safe_serialization=True)
    save_tokenizer(tok, d / "tokenizer")
    return d


def make_sample(rng: np.random.Generator, version: int, reward: float, prompt_len: int = 6, gen_len: int = 4,
                vocab: int = 40) -> Sample:
    n = prompt_len + gen_len
    mask = np.array([0] * prompt_len + [1] * gen_len, np.uint8)
    versions = np.where(mask == 1, version, -1).astype(np.int32)
    logprobs = np.where(mask == 1, -2.0, 0.0).astype(np.float32)
    return Sample(tokens=rng.integers(4, vocab, size=n).astype(np.int32), loss_mask=mask, logprobs=logprobs,
                  versions=versions, prompt_len=prompt_len, reward=reward)


def make_group(run: str, idx: int, version: int = 0, rewards=(1.0, 0.0), seed: int = 0,
               versions=None) -> TrajectoryGroup:
    rng = np.random.default_rng(seed * 100_003 + idx)
    vs = versions if versions is not None else [version] * len(rewards)
    return TrajectoryGroup(run=run, prompt_id=f"p{idx}", epoch=0,
                           samples=[make_sample(rng, v, r) for v, r in zip(vs, rewards, strict=True)])


async def publish_groups(js, nc, groups) -> None:
    for g in groups:
        await bus.publish(js, nc, subjects.trajectories(g.run), g, msg_id=g.group_id)


async def read_events(js, run: str, service: str = "trainer") -> list[Event]:
    """Every event of `service` in the EVENTS stream so far."""
    subject = subjects.events(run, service)
    try:
        info = await js.stream_info(subjects.EVENTS_STREAM, subjects_filter=subject)
        total = (info.state.subjects or {}).get(subject, 0)
    except Exception:
        total = 0
    if not total:
        return []
    sub = await js.subscribe(subject, ordered_consumer=True)
    out = []
    try:
        while len(out) < total:
            m = await sub.next_msg(timeout=5)
            out.append(codec.decode(m.data, Event))
    finally:
        await sub.unsubscribe()
    return out


async def _poll(fetch, done, proc: subprocess.Popen | None, timeout: float, what: str, last, every: float):
    """Await fetch() every `every` s until done(value) (returned); AssertionError naming `what` when the
    trainer exits first or after `timeout` (with last(value), the final reading)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        got = await fetch()
        if done(got):
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"trainer exited with {proc.returncode} before {what}")
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}; {last(got)}")
        await asyncio.sleep(every)


async def wait_for(js, run: str, pred, timeout: float = 120.0, proc: subprocess.Popen | None = None,
                   what: str = "condition") -> list[Event]:
    """Poll the trainer's events until pred(events) is true (or fail with the trainer's log tail)."""
    return await _poll(lambda: read_events(js, run), pred, proc, timeout, what,
                       lambda evs: f"events: {[e.kind for e in evs]}", 0.3)


async def wait_announced(js, run: str, version: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Poll the run's announced version until it reaches `version`: a step's version is published beside
    the next step (trainer.publish_overlap), after its "step" and "groups" events."""
    await _poll(lambda: latest_announced(js, run), lambda wv: wv is not None and wv.version >= version, proc,
                timeout, f"the announcement of version {version}", lambda wv: f"latest: {wv}", 0.1)


def steps(evs, kind: str = "step") -> list[dict]:
    return [e.data for e in evs if e.kind == kind]


def trainer_overrides(nats_url: str, tmp: Path, run: str, **extra) -> list[str]:
    base = {
        "run": run, "nats.servers": f"[{nats_url}]", "trainer.publisher": "directory",
        "trainer.publish_dir": str(tmp / "published"), "trainer.checkpoint_dir": str(tmp / "ckpt"),
        "telemetry.metrics_port": -1, "telemetry.events_interval_s": 60, "schedule.batch_size": 2,
        "trainer.optim.lr": 1e-3, "streams.duplicate_window_s": 120,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def start_trainer(overrides: list[str], log_path: Path, resume: bool = False) -> subprocess.Popen:
    argv = [sys.executable, "-m", "trainer_service.main"] + (["--resume"] if resume else []) + overrides
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=open(log_path, "ab"), stderr=subprocess.STDOUT)
