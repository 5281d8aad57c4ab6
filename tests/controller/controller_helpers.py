"""Helpers for the controller tests (imported by the test modules; fixtures live in conftest.py)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx
import uvicorn

from controller.api import make_app
from controller.service import Controller
from shared.config import JetrlConfig
from shared.contract import codec, subjects
from shared.contract.messages import PromptTask
from shared.runtime.natsd import free_port

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def make_config(tmp_path, nats_config, db_url: str, **controller) -> JetrlConfig:
    c = dict(db_url=db_url, data_dir=str(tmp_path / "data"), token=TOKEN, port=free_port(), poll_interval_s=0.2)
    c.update(controller)
    return JetrlConfig(nats=nats_config, controller=c)


@dataclass
class Live:
    url: str
    ctl: Controller
    cfg: JetrlConfig
    http: httpx.AsyncClient


async def start_live(cfg: JetrlConfig) -> tuple[Live, uvicorn.Server, asyncio.Task]:
    ctl = Controller(cfg)
    server = uvicorn.Server(uvicorn.Config(make_app(ctl), host="127.0.0.1", port=cfg.controller.port,
                                           log_level="warning", access_log=False))
    task = asyncio.create_task(server.serve())
    deadline = time.monotonic() + 30
    while not server.started:
        if task.done():
            task.result()
        assert time.monotonic() < deadline, "controller did not start"
        await asyncio.sleep(0.02)
    url = f"http://127.0.0.1:{cfg.controller.port}"
    # every /v1 route but health needs the token: the test client sends it (tests of refusals use their own)
    http = httpx.AsyncClient(base_url=url, timeout=120, headers=AUTH if cfg.controller.token == TOKEN else {})
    live = Live(url, ctl, cfg, http)
    await wait_for(lambda: ctl.ready, what="controller connected to NATS")
    return live, server, task


async def stop_live(handle) -> None:
    live, server, task = handle
    await live.http.aclose()
    server.should_exit = True
    await task


async def wait_for(cond, timeout: float = 30.0, what: str = "condition", interval: float = 0.05):
    """Poll `cond` (sync or async) until truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if asyncio.iscoroutine(v):
            v = await v
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


async def stream_prompts(js, run: str) -> list[tuple[str, PromptTask]]:
    """Every message of the run's prompts subject still in the PROMPTS stream: (Nats-Msg-Id, task)."""
    info = await js.stream_info(subjects.PROMPTS_STREAM)
    out = []
    subj = subjects.prompts(run)
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            m = await js.get_msg(subjects.PROMPTS_STREAM, seq)
        except Exception:
            continue
        if m.subject != subj:
            continue
        out.append(((m.headers or {}).get(subjects.MSG_ID_HEADER), codec.decode(m.data, expect=PromptTask)))
    return out


async def prompts_count(js, run: str) -> int:
    si = await js.stream_info(subjects.PROMPTS_STREAM, subjects_filter=subjects.prompts(run))
    return sum((si.state.subjects or {}).values())


def write_jsonl(path, rows) -> str:
    import json

    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def maxdigit_rows(n: int, seed: int = 0) -> list[dict]:
    import random

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        digits = [rng.randint(0, 9) for _ in range(5)]
        rows.append({"question": "max " + " ".join(map(str, digits)) + " =", "answer": str(max(digits)), "idx": i})
    return rows


def run_config(run: str = "t1", max_staleness: int = 0, batch_size: int = 4, **extra) -> dict:
    cfg = {"run": run, "schedule": {"max_staleness": max_staleness, "batch_size": batch_size},
           "rollout": {"group_size": 2, "workflow": "single_turn"}}
    cfg.update(extra)
    return cfg


def released_ledger(tmp_path, run: str, n: int):
    """(engine, sessionmaker) of a fresh SQLite controller database whose ledger holds `n` released groups
    `<run>:0:p<i>` (the ledger and follower tests, no NATS)."""
    from controller.db import Ledger, open_database

    engine, session = open_database(f"sqlite:///{tmp_path / 'c.db'}")
    rows = [dict(group_id=f"{run}:0:p{i}", run_id=run, enqueue_id=1, epoch=0, prompt_id=f"p{i}", row_index=i,
                 seq=i + 1, state="released", released_at_version=0, released_at=0.0, updated_at=0.0)
            for i in range(n)]
    with session.begin() as s:
        s.execute(Ledger.__table__.insert(), rows)
    return engine, session
