"""The fault suite: one demo-sized `jetrl up` run (testkit/fault_scenario.py) in which each
service is SIGKILLed once, one at a time, while work flows; then poison messages on every consumed
stream; then the run must finish with its books balanced.

The tests share the run (module scope) and run in file order: each fault test kills one service and
waits until it is back and the run progresses through it; the last test lets the run finish and audits
it. Waits are generous timeouts against hangs, never timing assertions."""

from __future__ import annotations

import pytest
import pytest_asyncio

from testkit.fault_scenario import FAULTS, FaultScenario

# The scenario's own deadlines (150 s a phase, 300 s for the end) fail first, with the services' logs.
pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(600)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def scenario(tmp_path_factory):
    sc = FaultScenario(tmp_path_factory.mktemp("faults"))
    try:
        await sc.start()
        yield sc
    finally:
        await sc.stop()


@pytest.mark.parametrize("fault", FAULTS)
async def test_the_run_recovers_from_a_sigkill_of(scenario, fault):
    out = await scenario.inject(fault)  # raises, with the children's log tails, if it never recovers
    assert scenario.launcher.sup.status()[fault]["restarts"] >= 1
    assert out.collateral == {}, f"other services crashed while {fault} was down: {out.collateral}"
    assert out.progress_s >= out.back_s > 0
    if fault == "trainer":
        resumed = [e["data"] for e in await scenario.events("resumed") if e["time"] > out.killed_at]
        assert resumed, "the restarted trainer did not resume from a checkpoint"
        assert resumed[0]["step"] > 0 and resumed[0]["next_version"] > resumed[0]["version"]


async def test_poison_messages_land_in_the_dlq_with_their_reason(scenario):
    poisons = await scenario.poison()  # waits for every dead letter and a trainer step after them
    sources = {"PROMPTS": "rollout", "TRAJECTORIES": "trainer",
               "EVENTS": "controller-events"}  # DLQ sources name the consumer kind, not the run (docs/protocol.md)
    assert {(p.stream, p.kind) for p in poisons} == {(s, k) for s in sources for k in ("not msgpack", "wrong schema")}
    for p in poisons:
        assert p.source == sources[p.stream], p
        assert p.reason.startswith("decode error: "), p
        assert ("not valid msgpack" if p.kind == "not msgpack" else "got WeightVersion") in p.reason, p


async def test_the_run_finishes_with_every_group_accounted_for_once(scenario):
    audit = await scenario.finish()
    lg = audit.ledger
    assert audit.trainer_exit == 0
    assert lg["in_flight"] == 0, lg
    assert lg["released"] == lg["trained"] + lg["dropped_stale"] + lg["filtered"] + lg["dead_lettered"], lg
    # every step trains a full batch but a drained one (the data of a slice ran out: controller/completion.py)
    assert set(audit.short_steps) <= audit.drained_steps, (audit.short_steps, audit.drained_steps)
    assert lg["trained"] == scenario.total_steps * scenario.batch_size - sum(audit.short_steps.values()), lg
    assert audit.ledger_rows == audit.distinct_groups == lg["released"]
    # the final model's lineage: steps 1..total_steps once each, every group trained once
    assert audit.lineage_steps == list(range(1, scenario.total_steps + 1))
    assert audit.duplicates == {}
    assert audit.lineage_groups == lg["trained"] and audit.ledger_vs_lineage == 0  # the same groups
    assert audit.resumed and audit.retrained > 0  # the trainer kill threw steps away; they were redone
    assert audit.versions_increasing and audit.versions[0] == 0
    assert audit.versions[-1] > scenario.total_steps  # numbering went on past the discarded versions
    for o in scenario.outcomes:
        assert o.lost == 0 and o.duplicated == 0, o
