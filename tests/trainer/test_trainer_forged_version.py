"""A forged weight announcement (`version=1000000` written into the KV by someone other
than the trainer) neither crashes the trainer nor moves its numbering: it is reported as a
"weights_refused" event naming the version and overwritten by the trainer's next real version.
Real nats-server, the real trainer process (directory publisher: its dir is the store it checks)."""

from __future__ import annotations

from trainer_testlib import (
    make_group,
    publish_groups,
    start_trainer,
    steps,
    trainer_overrides,
    wait_announced,
    wait_for,
)

from shared.contract import codec
from shared.contract.messages import WeightVersion
from shared.contract.subjects import WEIGHTS_KV_BUCKET
from weight_store.announce import latest as latest_announced

RUN = "forge"
FORGED = 1_000_000


async def forge(js) -> None:
    kv = await js.key_value(WEIGHTS_KV_BUCKET)
    await kv.put(RUN, codec.encode(WeightVersion(run=RUN, version=FORGED, step=FORGED, sha256="0" * 64)))


def refused(evs) -> list[int]:
    return [e.data["version"] for e in evs if e.kind == "weights_refused"]


async def test_a_forged_announcement_neither_crashes_nor_renumbers_the_trainer(nats_server, js, nc, tmp_path):
    ov = trainer_overrides(nats_server.url, tmp_path, RUN, **{"schedule.total_steps": 4,
                                                             "trainer.checkpoint_every": 100})
    await publish_groups(js, nc, [make_group(RUN, i) for i in range(4)])  # steps 1 and 2
    log = tmp_path / "trainer.log"
    p = start_trainer(ov, log)
    try:
        await wait_announced(js, RUN, 2, p)
        await forge(js)
        await publish_groups(js, nc, [make_group(RUN, i, version=2) for i in range(4, 8)])  # steps 3 and 4
        assert p.wait(180) == 0, log.read_text()[-3000:]  # it used to die on VersionConflict here
    finally:
        if p.poll() is None:
            p.kill()
    evs = await wait_for(js, RUN, lambda e: FORGED in refused(e), what="the weights_refused event")
    assert [s["version"] for s in steps(evs)] == [1, 2, 3, 4]
    assert (await latest_announced(js, RUN)).version == 4  # the forgery was overwritten

    # a restart with the forgery back in the KV numbers after the store (4), not after 1,000,000
    await forge(js)
    p = start_trainer(ov, log, resume=True)
    try:
        assert p.wait(180) == 0, log.read_text()[-3000:]
    finally:
        if p.poll() is None:
            p.kill()
    evs = await wait_for(js, RUN, lambda e: len(steps(e, "resumed")) >= 1, what="the resumed event")
    resumed = steps(evs, "resumed")[-1]
    assert resumed["announced_version"] == 4 and resumed["next_version"] == 5, resumed
    assert refused(evs).count(FORGED) >= 2
