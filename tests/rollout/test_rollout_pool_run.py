"""256 rollout workers through a real `jetrl up` (two processes of 128 asyncio workers, engine sim,
trainer sim, the real controller, ledger, reward service and weight store): every worker reports
healthy under its own id, the run trains every step, the ledger balances with nothing in flight, every
trained group was published by one of the 256 workers, and each process downloads a weight version
once for its 128 workers."""

from __future__ import annotations

from collections import Counter

import pytest

from launcher.demo.task import write_dataset
from launcher.plan import UpOptions
from launcher.up import Launcher, poll_until
from shared.config import JetrlConfig
from shared.model.tinymodel import build_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

WORKERS, PER_PROCESS, STEPS, BATCH, GROUP = 256, 128, 4, 32, 4
RUN = "scale256"


def settings() -> dict:
    return {
        "run": RUN,
        "nats": {"embedded": True},
        "telemetry": {"events_interval_s": 2.0, "log_level": "WARNING"},
        "schedule": {"max_staleness": 2, "batch_size": BATCH, "total_steps": STEPS},
        "reward": {"task": "maxdigit"},
        "rollout": {
            "engine": "sim", "group_size": GROUP, "max_in_flight": 2,
            "sampling": {"temperature": 1.0, "max_new_tokens": 32},
            "service": {"fetch_batch": 1, "workers_per_process": PER_PROCESS},
            "sim": {"vocab_size": len(build_tokenizer()), "output_len_median": 8, "decode_base_s": 0.02},
        },
        "trainer": {"backend": "sim", "sim": {"step_base_s": 0.2}, "checkpoint_every": 1000},
    }


async def test_256_workers_in_two_processes_train_every_step_and_account_for_every_group(tmp_path):
    cfg = JetrlConfig.model_validate(settings())
    dataset, _ = write_dataset(tmp_path / "data", train=2000, heldout=10, seed=0)
    launcher = Launcher(cfg, UpOptions(run_dir=tmp_path / "run", workers=WORKERS, echo_logs=False, with_eval=False))
    assert sorted(s.name for s in launcher.specs if s.name.startswith("rollout")) == ["rollout-0", "rollout-1"]
    http = None
    try:
        await launcher.start(timeout_s=300)
        http = launcher.http

        async def all_healthy():
            snap = await launcher.poll()
            alive = {s["instance"] for s in (snap.get("health") or {}).get("services", [])
                     if s["run"] == RUN and s["alive"] and s["service"] == "rollout"}
            return len(alive) >= WORKERS and alive

        alive = await poll_until(all_healthy, 300, f"{WORKERS} rollout workers healthy")
        await launcher.enqueue(dataset, epochs=1, shuffle_seed=0)

        async def finished():
            snap = await launcher.poll()
            lg = (snap.get("run") or {}).get("ledger") or {}
            return len(launcher.steps) >= STEPS and lg.get("in_flight") == 0 and lg.get("trained") and snap

        await poll_until(finished, 480, f"{STEPS} steps and nothing in flight")
        ledger = (await http.get(f"/v1/runs/{RUN}/ledger")).json()

        async def events(kind: str) -> list[dict]:
            return (await http.get(f"/v1/runs/{RUN}/events", params={"kind": kind, "limit": 10_000})).json()

        groups = await events("groups")
        trained = [g for e in groups for g in e["data"]["trained"]]

        async def all_published():
            pub = await events("published")
            by_group = {gid: e["data"]["worker"] for e in pub for gid in e["data"]["group_ids"]}
            return set(trained) <= set(by_group) and by_group

        published = await poll_until(all_published, 60, "every trained group's published event")
        weights = await events("weights")
    finally:
        await launcher.stop()

    ids = {f"{RUN}-rollout-{p}-{i}" for p in range(2) for i in range(PER_PROCESS)}
    assert alive == ids  # 256 workers, each under its own id
    assert ledger["balanced"] and ledger["in_flight"] == 0
    assert ledger["released"] == ledger["trained"] + ledger["dropped_stale"] + ledger["filtered"] + ledger["dead_lettered"]
    assert ledger["trained"] == len(trained) == len(set(trained)) == STEPS * BATCH  # nothing trains twice
    assert set(published.values()) <= ids
    assert len(Counter(published[g] for g in trained)) >= BATCH  # the work spread over many workers
    # one download per version per process: only each process's first worker reports the fetch counters
    fetchers = {e["data"]["worker"] for e in weights if "full_fetches" in e["data"]}
    assert fetchers and fetchers <= {f"{RUN}-rollout-0-0", f"{RUN}-rollout-1-0"}
    for w in fetchers:
        last = max((e for e in weights if e["data"]["worker"] == w), key=lambda e: e["data"]["version"])["data"]
        assert last["full_fetches"] + last["delta_fetches"] <= STEPS + 1
    assert len({e["data"]["worker"] for e in weights}) > 2  # and every worker swaps the versions in
