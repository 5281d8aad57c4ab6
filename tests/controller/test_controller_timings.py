"""GET /v1/runs/{run}/timings: the trainer's stage timings per version joined with the workers' weight
fetch/swap seconds, and the "where did the time go" rows the launcher prints from it."""

from __future__ import annotations

import pytest
from controller_helpers import AUTH, run_config, wait_for

from launcher.time_report import time_rows, time_table
from shared.contract import bus, subjects
from shared.contract.messages import TRAINER_STAGES, Event


def step_data(v: int) -> dict:
    t = dict.fromkeys(TRAINER_STAGES, 0.0)
    t.update(wait=1.0 * v, forward=0.5, backward=1.0, optimizer=0.25, publish=0.25)
    return {"version": v, "step": v, "wall_s": sum(t.values()), "timings": t,
            "rollout_timings": {"generate": 2.0 * v, "reward": 0.5, "tools": 0.0, "queue_wait": 3.0}}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_timings_join_trainer_stages_and_weight_loads_per_version(live, js, nc):
    assert (await live.http.post("/v1/runs", json=run_config("tm", 1, 4), headers=AUTH)).status_code == 201
    for v in (1, 2):
        await bus.publish(js, nc, subjects.events("tm", "trainer"),
                          Event(run="tm", service="trainer", kind="step", data=step_data(v)))
    for w, (f, s) in enumerate([(0.2, 0.1), (0.4, 0.3)]):  # two workers load version 1; none loaded 2 yet
        await bus.publish(js, nc, subjects.events("tm", "rollout"),
                          Event(run="tm", service="rollout", kind="weights", instance=f"w{w}",
                                data={"version": 1, "fetch_s": f, "swap_s": s, "worker": f"w{w}"}))
    got = {}

    async def stored():
        got.update((await live.http.get("/v1/runs/tm/timings")).json())
        fetch = got.get("weights", {}).get("fetch") or [None]
        # both workers' loads stored (their mean; the follower stores events concurrently)
        return got.get("versions") == [1, 2] and fetch[0] is not None and abs(fetch[0] - 0.3) < 1e-9

    await wait_for(stored, what="2 step events and the weight loads stored")
    assert got["wall_s"] == [3.0, 4.0] and got["steps"] == [1, 2]
    assert got["trainer"]["wait"] == [1.0, 2.0] and got["trainer"]["backward"] == [1.0, 1.0]
    assert got["rollout"]["generate"] == [2.0, 4.0]
    assert got["weights"]["fetch"] == [pytest.approx(0.3), None] and got["weights"]["swap"] == [pytest.approx(0.2), None]
    tot = got["totals"]
    assert tot["wall_s"] == 7.0 and tot["trainer"]["wait"] == 3.0 and tot["rollout"]["generate"] == 3.0
    assert tot["weights"]["fetch"] == pytest.approx(0.3)
    assert (await live.http.get("/v1/runs/tm/timings", params={"last": 1})).json()["versions"] == [2]

    rows = time_rows(got)
    assert rows[0] == ("trainer", "wait", 3.0, pytest.approx(3.0 / 7.0))  # biggest first, share of the wall time
    assert sum(share for side, _, _, share in rows if side == "trainer") == pytest.approx(1.0)
    assert ("weights (mean per load)", "swap", pytest.approx(0.2), None) in rows
    assert time_table(got).row_count == len(rows)
