"""A run ends when its work ends (issue 34): 10 prompts and a batch of 4 leave 2 groups after two full
batches. Through a real `jetrl up` (up_main, every service a process) the controller sends `drain`, the
trainer trains the last 2 groups as a smaller batch, the controller sends `run_complete`, and `jetrl up`
stops by itself long before total_steps (50) could be reached, with every prompt accounted for in the ledger.
`jetrl why` then says the run is complete."""

import json

import pytest
from sqlalchemy import select

from controller import completion, diagnosis, evidence
from controller.db import EventRow, open_database
from launcher.plan import UpOptions
from launcher.up import up_main
from shared.config import JetrlConfig, load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROMPTS, BATCH = 10, 4


async def test_a_run_whose_data_is_not_a_multiple_of_the_batch_ends_by_itself(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"max {i} {9 - i} =", "reference": str(max(i, 9 - i))}) + "\n"
                            for i in range(PROMPTS)))
    p = tmp_path / "c.yaml"
    p.write_text("run: ends\nnats: {embedded: true}\ntelemetry: {events_interval_s: 1.0}\nreward: {task: maxdigit}\n"
                 f"schedule: {{total_steps: 50, batch_size: {BATCH}, max_staleness: 8}}\n"
                 "rollout: {group_size: 2, sampling: {max_new_tokens: 1}}\n")
    cfg = load_config(JetrlConfig, str(p), [])
    run_dir = tmp_path / "run"
    code = await up_main(cfg, UpOptions(run_dir=run_dir, echo_logs=False, with_eval=False), dataset=str(data),
                         panel=False)
    assert code == 0

    _, Session = open_database(f"sqlite:///{run_dir / 'controller.db'}")
    with Session() as s:
        prog = completion.progress(s, "ends")
        evs = {k: [e.data for e in s.scalars(select(EventRow).where(EventRow.run_id == "ends", EventRow.kind == k)
                                            .order_by(EventRow.id))]
               for k in ("step", "drain", "run_complete")}
    led = prog["ledger"]
    assert prog["state"] == "complete" and prog["enqueued"] == PROMPTS
    assert led["released"] == PROMPTS and led["in_flight"] == 0 and led["balanced"]
    assert led["trained"] + led["dropped_stale"] + led["filtered"] + led["dead_lettered"] == PROMPTS
    steps = evs["step"]
    assert len(steps) == 3, [(x["step"], x["groups"], x.get("partial")) for x in steps]
    assert [x["partial"] for x in steps] == [False, False, True]
    assert sum(x["groups"] for x in steps) == led["trained"]
    assert 1 <= steps[-1]["groups"] <= PROMPTS - 2 * BATCH
    assert evs["drain"] and len(evs["run_complete"]) == 1
    assert evs["run_complete"][0]["released"] == PROMPTS

    ev = evidence.from_database(Session, "ends")
    ev.update(queues={"nats": "connected"}, store={"ok": True}, nats={})
    d = diagnosis.diagnose(ev)
    assert d["state"] == "complete" and [f["cause"] for f in d["findings"]] == ["complete"]


async def test_a_run_paced_by_its_enqueues_drains_mid_run_and_still_ends_with_nothing_in_flight(tmp_path):
    """The data comes in two enqueues (as the multihost spread run paces its slices). The first, 10 prompts
    at batch 4, ends in a drained batch of 2 at step 3; the second has more than the 2 steps left need.
    The admission bound counts the 2 groups step 3 trained short of a batch (ledger.short_of): before it
    did, the controller released 2 groups too many and the trainer stopped at total_steps holding them,
    the ledger never empty (the spread run's failure in CI: 4 groups received and never trained)."""
    import asyncio
    import time

    from launcher.up import Launcher

    def rows(n: int, seed: int) -> str:
        return "".join(json.dumps({"prompt": f"max {(i + seed) % 10} {(9 - i) % 10} =",
                                   "reference": str(max((i + seed) % 10, (9 - i) % 10))}) + "\n" for i in range(n))

    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(rows(PROMPTS, 0))
    second.write_text(rows(3 * BATCH, 5))
    p = tmp_path / "c.yaml"
    p.write_text("run: paced\nnats: {embedded: true}\ntelemetry: {events_interval_s: 1.0}\nreward: {task: maxdigit}\n"
                 f"schedule: {{total_steps: 5, batch_size: {BATCH}, max_staleness: 8}}\n"
                 "rollout: {group_size: 2, sampling: {max_new_tokens: 1}}\n")
    cfg = load_config(JetrlConfig, str(p), [])
    launcher = Launcher(cfg, UpOptions(run_dir=tmp_path / "run", echo_logs=False, with_eval=False))

    async def until(check, what: str, timeout_s: float = 240.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            snap = await launcher.poll()
            if check(snap):
                return snap
            await asyncio.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}: {snap.get('run')}")

    try:
        await launcher.start(timeout_s=120)
        await launcher.enqueue(first)
        await until(lambda s: len(launcher.steps) >= 3, "the drained step 3")
        assert [x["partial"] for x in launcher.steps] == [False, False, True]
        await launcher.enqueue(second)
        await until(launcher.trainer_done, "the trainer to finish 5 steps")
        snap = await until(lambda s: (s.get("run") or {}).get("ledger", {}).get("awaiting_trajectory") == 0,
                           "the groups still out to come back", 60)
        led = snap["run"]["ledger"]
    finally:
        await launcher.stop()
    short = BATCH - launcher.steps[2]["groups"]
    assert short > 0
    assert led["in_flight"] == 0, led
    assert led["trained"] == 5 * BATCH - short, led
    assert led["balanced"] and led["released"] == led["trained"] + led["dropped_stale"] + led["filtered"] + \
        led["dead_lettered"], led
