"""The collapse guard (trainer_service/guard.py): its checks on hand-computed step statistics, then two real
runs through `jetrl up` -- one driven to collapse by a learning rate 100x the demo's, where the guard trips
and rolls back with the ledger balanced and nothing trained twice, and a healthy one where it never trips."""

import re
from collections import Counter

import pytest

from shared.config.trainer import GuardConfig
from trainer_service.guard import Guard, failures

HIST = [{"entropy": e, "grad_norm": g, "reward_mean": r, "clip_frac": 0.1, "capped_frac": 0.0}
        for e, g, r in [(2.0, 1.0, 0.5), (1.8, 2.0, 0.4), (2.2, 1.5, 0.6), (1.9, 1.2, 0.5), (2.1, 1.8, 0.5)]]
# medians: entropy 2.0, grad_norm 1.5, reward_mean 0.5


def test_each_check_against_the_median_of_good_steps():
    cfg = GuardConfig(enabled=True, reward_drop=0.2)
    ok = {"entropy": 0.6, "grad_norm": 14.0, "reward_mean": 0.31, "clip_frac": 0.6, "capped_frac": 0.5}
    assert failures(cfg, HIST, ok) == {}  # every value at its limit passes: 0.6 > 0.25 x 2.0 = 0.5 etc.
    bad = {"entropy": 0.4, "grad_norm": 15.1, "reward_mean": 0.29, "clip_frac": 0.61, "capped_frac": 0.51}
    f = failures(cfg, HIST, bad)
    assert set(f) == {"entropy", "grad_norm", "reward_mean", "clip_frac", "capped_frac"}
    assert f["entropy"] == {"value": 0.4, "limit": 0.5, "median": 2.0}
    assert f["grad_norm"] == {"value": 15.1, "limit": 15.0, "median": 1.5}
    assert f["reward_mean"]["limit"] == pytest.approx(0.3)
    assert failures(cfg, HIST[:4], bad) == {}  # fewer than min_history (5) good steps: no check yet
    off = GuardConfig(enabled=True, entropy_ratio=0, max_capped_frac=1, max_clip_frac=1, grad_norm_ratio=0)
    assert failures(off, HIST, bad) == {}


def test_it_trips_after_consecutive_failures_and_bad_steps_never_become_the_baseline():
    g = Guard(GuardConfig(enabled=True, consecutive=2))
    for i, h in enumerate(HIST):
        assert g.observe(i + 1, h) is None
    collapsed = {"entropy": 0.1, "grad_norm": 1.0}
    assert g.observe(6, collapsed) is None  # one failing step is not a trip
    assert g.observe(7, dict(HIST[0])) is None  # a good step ends the streak
    assert g.observe(8, collapsed) is None
    trip = g.observe(9, collapsed)
    assert trip == {"step": 9, "since_step": 8, "reasons": ["entropy"],
                    "evidence": {"8": {"entropy": {"value": 0.1, "limit": 0.5, "median": 2.0}},
                                 "9": {"entropy": {"value": 0.1, "limit": 0.5, "median": 2.0}}}}
    assert len(g.history) == 6 and collapsed not in g.history  # the five good steps and step 7
    g.reset()
    assert g.observe(10, collapsed) is None  # after a trip a new streak starts


# --- real runs --------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_a_run_driven_to_collapse_is_rolled_back_and_a_healthy_one_is_left_alone(tmp_path):
    from testkit.diagnosis_scenario import DiagnosedRun, poll_until

    guard = {"enabled": True, "action": "rollback", "min_history": 3, "consecutive": 2}
    hot = DiagnosedRun(tmp_path, "hot", {
        "trainer": {"guard": guard, "checkpoint_every": 2, "keep_checkpoints": 100,
                    "optim": {"lr": 0.1, "lr_schedule": "constant"}, "algorithm": {"ppo_minibatches": 4}}})
    try:
        await hot.start()
        http = hot.launcher.http

        async def events(kind: str) -> list[dict]:
            return (await http.get("/v1/runs/hot/events", params={"kind": kind, "limit": 10000})).json()

        async def tripped():
            if hot.launcher.sup.failure is not None:
                raise AssertionError(hot.launcher.sup.failure.message())
            return await events("guard_tripped")

        trips = await poll_until(tripped, 400, "the collapse guard to trip")
        t = trips[0]["data"]
        assert t["action"] == "rollback", t
        assert t["to_step"] < t["since_step"] and t["new_version"] > t["version"] and t["lr_factor"] == 0.5
        before = len(hot.launcher.steps)
        await hot.until_steps(before + 2)  # it goes on after the rollback
        d = await hot.why()
        assert "collapse_guard" in [f["cause"] for f in d["findings"]], d
        hot.launcher.sup.children["rollout"].spec.restart = False
        await hot.launcher.stop_child("rollout")  # nothing new generated; let the ledger settle
        ledger = (await http.get("/v1/runs/hot/ledger")).json()
        assert ledger["balanced"], ledger
        groups = await events("groups")
        trained_in = {}
        for e in groups:
            for gid in e["data"]["trained"]:
                trained_in.setdefault(gid, []).append(e["data"]["step"])
        reasons = {gid: r for e in groups for gid, r in (e["data"].get("filtered_reasons") or {}).items()}
        # every rollback, each named by the step it rolled back to ("trained after step N"): at half the
        # learning rate the run may collapse, and be rolled back, again before the rollout worker is stopped
        discarded = {gid: int(re.search(r"trained after step (\d+)", r).group(1))
                     for gid, r in reasons.items() if "rolled back" in r}
        per_trip = Counter()
        for trip in await events("guard_tripped"):
            per_trip[trip["data"]["to_step"]] += trip["data"]["discarded_groups"]
        assert discarded and Counter(discarded.values()) == per_trip
        for gid, to_step in discarded.items():  # each discarded group was trained once, after its checkpoint
            assert len(trained_in[gid]) == 1 and trained_in[gid][0] > to_step
        # nothing trained twice in the final lineage: a group trained again would be in two "trained" lists
        assert all(len(steps) == 1 for steps in trained_in.values())
    finally:
        await hot.close()

    calm = DiagnosedRun(tmp_path, "calm", {"trainer": {"guard": guard}})
    try:
        await calm.start()
        await calm.until_steps(40, timeout_s=400)
        evs = (await calm.launcher.http.get("/v1/runs/calm/events", params={"kind": "guard_tripped"})).json()
        assert evs == []
    finally:
        await calm.close()
