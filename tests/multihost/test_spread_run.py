"""One run spread over five hosts (network namespaces on a private bridge, multihost/spread.py):
controller + NATS n1 on a, weight store + n2 on b, trainer + n3 on c, a rollout worker and a reward replica
on each of d and e; R3 streams; workers fetch weights over HTTP across the bridge. While it trains: one
NATS node is SIGKILLed, host d's link is cut for 20 s, every process on host e is killed, and a worker on a
new host f joins. The run must finish with its books balanced (the fault suite's audit). The tests share
the run (module scope) and run in file order."""

from __future__ import annotations

import pytest
import pytest_asyncio
from multihost_helpers import need_netns

from multihost.spread import SpreadScenario

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(600)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def spread(tmp_path_factory):
    need_netns()
    sc = SpreadScenario(tmp_path_factory.mktemp("spread"))
    try:
        await sc.start()
        yield sc
    finally:
        await sc.stop()


async def test_killing_one_nats_node_does_not_stop_the_run(spread):
    out = await spread.kill_nats_node("n1")
    assert out.progress_s > 0  # trainer steps were made while n1 was dead
    info = spread.cluster.jsz("n1")["meta_cluster"]
    assert info["cluster_size"] == 3 and info["leader"]


async def test_a_host_cut_off_for_20_s_rejoins(spread):
    out = await spread.cut_link("d")
    assert out.progress_s < out.back_s  # the run went on without d; d reported again after the cut
    assert spread.launcher.sup.status()["rollout-d"]["running"]


async def test_a_dead_host_s_work_is_redone_elsewhere(spread):
    out = await spread.kill_host("e")
    st = spread.launcher.sup.status()
    assert not st["rollout-e"]["running"] and not st["reward-e"]["running"]
    assert spread.net.pids("e") == [] and out.progress_s > 0


async def test_a_worker_on_a_new_host_joins_mid_run(spread):
    out = await spread.add_worker("f")
    assert out.back_s > 0 and spread.launcher.sup.status()["rollout-f"]["running"]


async def test_the_spread_run_finishes_with_every_group_accounted_for_once(spread):
    audit = await spread.finish()
    lg = audit.ledger
    assert audit.trainer_exit == 0
    assert lg["in_flight"] == 0, lg
    assert lg["released"] == lg["trained"] + lg["dropped_stale"] + lg["filtered"] + lg["dead_lettered"], lg
    # every step trains a full batch but a drained one (the data of a slice ran out: controller/completion.py)
    assert set(audit.short_steps) <= audit.drained_steps, (audit.short_steps, audit.drained_steps)
    assert lg["trained"] == spread.total_steps * spread.batch_size - sum(audit.short_steps.values()), lg
    assert audit.ledger_rows == audit.distinct_groups == lg["released"]
    assert audit.lineage_steps == list(range(1, spread.total_steps + 1))
    assert audit.duplicates == {}
    assert audit.lineage_groups == lg["trained"] and audit.ledger_vs_lineage == 0
    assert audit.versions_increasing and audit.versions[0] == 0
    for o in spread.outcomes:
        assert o.lost == 0 and o.duplicated == 0, o
