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
