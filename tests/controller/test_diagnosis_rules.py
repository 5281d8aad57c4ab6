"""controller/diagnosis.py's rules on hand-built evidence: each cause from its own evidence, thresholds from
the step times, and nothing named for a healthy run. (Real runs driven into the causes:
tests/fault/test_diagnosis.py.)"""

import copy

import pytest

from controller.diagnosis import diagnose, thresholds

NOW = 1_000_000.0


def healthy() -> dict:
    led = {"released": 40, "in_flight": 12, "awaiting_trajectory": 8, "trajectory_received": 4, "trained": 28,
           "dropped_stale": 0, "filtered": 0, "dead_lettered": 0, "outstanding": 40, "balanced": True}
    return {
        "now": NOW,
        "run": {"id": "r", "status": "running", "current_version": 7, "batch_size": 4, "max_staleness": 2,
                "events_interval_s": 1.0, "reward_task": "maxdigit", "online": False},
        "progress": {"state": "releasing", "enqueued": 100, "ledger": led},
        "admission": {"bound": 40, "outstanding": 40},
        "health": [
            {"service": "trainer", "instance": "t", "last_seen": NOW - 1,
             "data": {"phase": "waiting for groups", "phase_since": NOW - 2}},
            {"service": "rollout", "instance": "w", "last_seen": NOW - 1, "data": {"version": 7, "in_flight": 3}},
            {"service": "reward", "instance": "q", "last_seen": NOW - 1, "data": {}},
        ],
        "steps": [{"time": NOW - 10 + i, "step": i, "version": i, "wall_s": 2.0} for i in range(8)],
        "trainer_started": NOW - 100, "current_version_since": NOW - 3, "last_published": NOW - 1,
        "outcomes": {"trained": 28}, "oldest_in_flight": [{"group_id": "r:0:a", "state": "released", "since": NOW - 5}],
        "dead_letters": {"recent": 0, "window_s": 300, "reasons": []}, "warnings": [],
        "signal": {"no_signal": False}, "queues": {"nats": "connected"}, "store": {"ok": True},
        "nats": {"storage": 10, "storage_max": -1}, "limits": {"alive_s": 15.0, "stall_s": 30.0},
    }


def with_(**changes) -> dict:
    ev = copy.deepcopy(healthy())
    for path, value in changes.items():
        node = ev
        *head, last = path.split("__")
        for k in head:
            node = node[k]
        node[last] = value
    return ev


def causes(d: dict) -> list[str]:
    return [f["cause"] for f in d["findings"]]


def test_a_healthy_run_advances_with_nothing_named():
    d = diagnose(healthy())
    assert d["state"] == "advancing" and d["findings"] == []
    assert "version 7" in d["summary"]


def test_thresholds_follow_the_median_step_time():
    ev = healthy()
    assert thresholds(ev) == (15.0, 30.0)  # 2 x 2 s is below the 30 s floor
    ev["steps"] = [{"time": NOW, "wall_s": w} for w in (10, 40, 20)]
    assert thresholds(ev) == (15.0, 40.0)  # 2 x the median 20 s
    ev["run"]["events_interval_s"] = 10.0
    assert thresholds(ev)[0] == 30.0


def _dead(service: str) -> list[dict]:
    return [dict(h, last_seen=NOW - 60) if h["service"] == service else h for h in healthy()["health"]]


@pytest.mark.parametrize("ev, cause", [
    (with_(health=_dead("trainer"), steps=[]), "trainer_dead"),
    (with_(health=_dead("rollout"), last_published=NOW - 60), "no_rollout_worker"),
    (with_(health=_dead("reward")), "reward_unavailable"),
    (with_(store={"ok": False, "error": "ConnectError: refused", "url": "http://x"}), "weight_store_down"),
    (with_(queues={"nats": "connecting"}), "nats_unreachable"),
    (with_(nats={"storage": 99, "storage_max": 100}), "disk_full"),
])
def test_each_dead_part_is_named(ev, cause):
    d = diagnose(ev)
    assert cause in causes(d), d
    f = next(f for f in d["findings"] if f["cause"] == cause)
    assert f["severity"] == "error" and f["action"]


def test_a_trainer_stuck_outside_its_wait_names_the_phase_and_its_error():
    ev = with_(steps=[{"time": NOW - 100, "wall_s": 2.0}])
    ev["health"][0]["data"] = {"phase": "publishing", "phase_since": NOW - 90,
                               "publish_error": "version 8: WeightStoreError: 507 no_space: No space left on device"}
    d = diagnose(ev)
    assert d["state"] == "stalled"
    assert causes(d)[:2] == ["disk_full", "trainer_stuck"]  # the full disk is why it is stuck
    assert "publishing" in d["findings"][1]["summary"]
    ev["health"][0]["data"]["phase"] = "waiting for groups"  # waiting on others is not stuck
    assert "trainer_stuck" not in causes(diagnose(ev))


def test_workers_behind_the_announced_version_say_why():
    ev = with_(run__current_version=9, current_version_since=NOW - 60)
    ev["health"][1]["data"] = {"version": 5, "fetch_error": "version 9: ConnectError: refused", "in_flight": 0}
    d = diagnose(ev)
    f = next(f for f in d["findings"] if f["cause"] == "workers_behind")
    assert "fetch fails" in f["summary"] and "refused" in f["summary"]
    ev["health"][1]["data"] = {"version": 5}
    ev["warnings"] = [{"service": "rollout", "kind": "weights_refused", "time": NOW - 5,
                       "data": {"version": 9, "error": "manifest digest mismatch"}}]
    assert "refused version(s) 9" in next(f["summary"] for f in diagnose(ev)["findings"] if f["cause"] == "workers_behind")
    ev["current_version_since"] = NOW - 2  # just announced: the workers have not had time to fetch it
    assert "workers_behind" not in causes(diagnose(ev))


def test_reward_timeouts_with_replicas_alive_are_a_backlog():
    ev = healthy()
    ev["health"][1]["data"].update(last_error="Transient: reward task 'maxdigit': no reply on jetrl.reward.maxdigit "
                                   "within 2s (after 2 attempts)", last_error_at=NOW - 3)
    f = next(f for f in diagnose(ev)["findings"] if f["cause"] == "reward_unavailable")
    assert "alive but" in f["summary"] and "no reply" in f["summary"]


def test_admission_full_names_the_oldest_group_and_where_it_is():
    ev = with_(oldest_in_flight=[{"group_id": "r:0:x", "state": "received", "since": NOW - 120}],
               steps=[{"time": NOW - 120, "wall_s": 2.0}], last_published=NOW - 120)
    ev["health"][1]["data"]["in_flight"] = 0
    f = next(f for f in diagnose(ev)["findings"] if f["cause"] == "admission_full")
    assert "r:0:x" in f["summary"] and "at the trainer" in f["summary"]
    ev["admission"]["outstanding"] = 39  # below the bound: not this cause
    assert "admission_full" not in causes(diagnose(ev))


def test_stale_drops_are_an_error_when_nothing_trains_and_a_warning_otherwise():
    d = diagnose(with_(outcomes={"trained": 0, "dropped_stale": 12}))
    f = next(f for f in d["findings"] if f["cause"] == "all_stale")
    assert f["severity"] == "error" and "100%" in f["summary"] and d["state"] == "stalled"
    f = next(f for f in diagnose(with_(outcomes={"trained": 4, "dropped_stale": 8}))["findings"] if f["cause"] == "all_stale")
    assert f["severity"] == "warning" and "67%" in f["summary"]
    assert "all_stale" not in causes(diagnose(with_(outcomes={"trained": 10, "dropped_stale": 2})))


def test_warnings_leave_the_run_advancing():
    ev = with_(dead_letters={"recent": 3, "window_s": 300, "reasons": [["rollout: prompt too long", 3]]},
               signal={"no_signal": True, "message": "no spread in 12 groups", "since_step": 3, "groups": 12})
    d = diagnose(ev)
    assert d["state"] == "advancing" and causes(d) == ["dead_letters", "no_signal"]
    assert "prompt too long (3x)" in d["findings"][0]["summary"]


def test_end_states_are_said_first():
    done = with_(progress__state="complete", progress__ledger__in_flight=0)
    d = diagnose(done)
    assert d["state"] == "complete" and causes(d) == ["complete"]
    assert diagnose(with_(run__status="paused"))["state"] == "paused"
    assert diagnose(with_(progress__state="no data"))["state"] == "no data"
    online = with_(progress__state="no data", run__online=True)
    assert diagnose(online)["state"] == "advancing"


def test_a_stall_with_no_known_cause_says_so():
    ev = with_(steps=[{"time": NOW - 100, "wall_s": 2.0}], last_published=NOW - 100)
    ev["health"][1]["data"]["in_flight"] = 0
    d = diagnose(ev)
    assert d["state"] == "stalled" and causes(d) == ["unknown"]


def test_a_guard_trip_is_listed_and_a_pause_by_it_is_said():
    trip = {"time": NOW - 30, "step": 12, "since_step": 11, "reasons": ["entropy"], "action": "rollback",
            "to_step": 10, "weights_of_version": 10, "new_version": 13, "discarded_groups": 8, "lr_factor": 0.5,
            "evidence": {"11": {"entropy": {"value": 0.1}}}}
    d = diagnose(with_(guard=trip))
    f = next(f for f in d["findings"] if f["cause"] == "collapse_guard")
    assert "rolled back to step 10" in f["summary"] and "8 trained groups discarded" in f["summary"]
    assert d["state"] == "advancing"  # a warning
    paused = with_(guard=dict(trip, action="pause"), run__status="paused")
    d = diagnose(paused)
    assert d["state"] == "paused" and "by the collapse guard at step 12: entropy" in d["summary"]
