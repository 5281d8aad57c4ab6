"""The lineage check of the fault suite (testkit/fault_scenario.py), on hand-made trainer events."""

from testkit.fault_scenario import lineage, trained_twice


def groups(t: float, step: int, *ids: str) -> dict:
    return {"time": t, "data": {"step": step, "version": step, "trained": list(ids), "dropped_stale": []}}


def resumed(t: float, step: int) -> dict:
    return {"time": t, "data": {"step": step, "version": step, "next_version": 9}}


def test_a_resume_discards_the_steps_after_its_checkpoint_and_keeps_the_retrained_ones():
    evs = [groups(1, 1, "a", "b"), groups(2, 2, "c", "d"), groups(3, 3, "e", "f"), groups(4, 4, "g", "h"),
           groups(7, 3, "e", "g"), groups(8, 4, "i", "j"), groups(8.5, 4), groups(9, 5, "f", "k")]
    steps, discarded = lineage(evs, [resumed(6, 2)])
    assert [s for s, _ in steps] == [1, 2, 3, 4, 5]
    assert discarded == 4  # e, f, g, h were trained into versions the resume threw away
    assert trained_twice(steps) == {}


def test_a_group_trained_twice_in_the_lineage_is_reported():
    steps, _ = lineage([groups(1, 1, "a"), groups(2, 2, "b"), groups(5, 3, "a")], [resumed(4, 2)])
    assert trained_twice(steps) == {"a": 2}
    # no resume: nothing is discarded
    steps, discarded = lineage([groups(1, 1, "a"), groups(2, 2, "b")], [])
    assert (discarded, trained_twice(steps)) == (0, {})
