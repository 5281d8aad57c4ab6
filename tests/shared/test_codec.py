"""The msgpack codec: round-trips of every schema, strictness, versioning, unknown fields."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.contract import codec
from shared.contract.codec import DecodeError
from shared.contract.messages import (
    ALL_MESSAGES,
    DeadLetter,
    Event,
    PromptTask,
    RewardRequest,
    RewardResult,
    Sample,
    TrajectoryGroup,
    WeightVersion,
)

# --- strategies -------------------------------------------------------------------------------------

ints = st.integers(-(2**63), 2**63 - 1)
floats = st.floats(allow_nan=False)
text = st.text(max_size=12)
scalars = st.none() | st.booleans() | ints | floats | text | st.binary(max_size=8)
plain = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                     max_leaves=8)
maps = st.dictionaries(text, plain, max_size=4)


@st.composite
def samples(draw, n=None):
    """A valid Sample of n tokens (drawn from sizes that include empty and 32k-token samples)."""
    if n is None:
        n = draw(st.sampled_from([0, 1, 3, 64, 32768]) | st.integers(0, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    mask = rng.integers(0, 2, n, dtype=np.uint8)
    turns = np.sort(rng.integers(0, max(n, 1), draw(st.integers(0, 3)))).astype(np.int32)
    return Sample(
        tokens=rng.integers(-(2**31), 2**31 - 1, n, dtype=np.int32),
        loss_mask=mask,
        logprobs=(-rng.random(n, dtype=np.float32) * mask).astype(np.float32),
        versions=np.where(mask == 1, rng.integers(0, 1000, n), -1).astype(np.int32),
        prompt_len=draw(st.integers(0, n)),
        reward=draw(floats),
        finish_reason=draw(st.sampled_from(["stop", "length", "abort", "error", "tool_limit"])),
        turns=turns,
        timings=draw(st.dictionaries(text, floats, max_size=3)),
        metrics=draw(maps),
    )


prompt_tasks = st.builds(
    PromptTask, run=text, prompt_id=text, epoch=ints, payload=maps, dataset=text, workflow=text,
    group_size=st.integers(1, 2**31), sampling=maps, released_at_version=ints, released_at=floats,
)
trajectory_groups = st.builds(
    TrajectoryGroup, run=text, prompt_id=text, epoch=ints, samples=st.lists(samples(), max_size=3),
    workflow=text, worker=text, released_at_version=ints, created_at=floats, metrics=maps,
)
reward_requests = st.builds(
    RewardRequest, task=text, completions=st.lists(st.text(max_size=40), max_size=4), reference=plain,
    payload=maps, request_id=text,
    completion_ids=st.none() | st.lists(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=20).map(
        lambda x: np.array(x, dtype=np.int32)), max_size=3),
    timeout_s=st.none() | floats,
)
reward_results = st.builds(
    RewardResult, task=text, rewards=st.lists(floats, max_size=4), request_id=text,
    metrics=st.lists(maps, max_size=3), errors=st.lists(st.none() | text, max_size=3), error=st.none() | text,
    elapsed_s=floats,
)
weight_versions = st.builds(
    WeightVersion, run=text, version=ints, step=ints, manifest_url=text,
    files=st.lists(st.fixed_dictionaries({"name": text, "size": st.integers(0, 2**40), "sha256": text}), max_size=3),
    sha256=text, created_at=floats,
)
events = st.builds(Event, run=text, service=text, kind=text, data=maps, instance=text, time=floats)
dead_letters = st.builds(
    DeadLetter, run=text, source=text, subject=text, reason=text, original=st.binary(max_size=200),
    delivery_count=ints, stream=text, stream_seq=ints, headers=st.dictionaries(text, text, max_size=3), time=floats,
)
STRATEGIES = {
    PromptTask: prompt_tasks,
    TrajectoryGroup: trajectory_groups,
    RewardRequest: reward_requests,
    RewardResult: reward_results,
    WeightVersion: weight_versions,
    Event: events,
    DeadLetter: dead_letters,
}
any_message = st.one_of(*STRATEGIES.values())


def test_every_message_schema_has_a_strategy():
    assert set(STRATEGIES) == set(ALL_MESSAGES) == set(codec.SCHEMAS.values())


def assert_same_message(a, b) -> None:
    assert type(a) is type(b)
    assert codec.to_wire(a) == codec.to_wire(b)


# --- round trips ------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(msg=any_message)
def test_every_schema_round_trips_byte_for_byte(msg):
    data = codec.encode(msg)
    back = codec.decode(data, expect=type(msg))
    assert_same_message(back, msg)
    assert codec.encode(back) == data  # re-encoding is stable, nothing added or lost


@pytest.mark.parametrize("n", [0, 32768])
def test_empty_and_32k_token_samples_round_trip_with_their_dtypes(n):
    rng = np.random.default_rng(n)
    s = Sample(tokens=rng.integers(0, 50000, n, dtype=np.int32), loss_mask=np.ones(n, np.uint8),
               logprobs=rng.standard_normal(n).astype(np.float32), versions=np.full(n, 7, np.int32), prompt_len=0)
    g = TrajectoryGroup(run="r", prompt_id="p", epoch=1, samples=[s, s])
    data = codec.encode(g)
    back = codec.decode(data, expect=TrajectoryGroup)
    for got in back.samples:
        for name, dtype in (("tokens", "<i4"), ("loss_mask", "u1"), ("logprobs", "<f4"), ("versions", "<i4")):
            arr = getattr(got, name)
            assert arr.dtype == np.dtype(dtype) and arr.shape == (n,)
            np.testing.assert_array_equal(arr, getattr(s, name))
    if n:  # packed arrays: 13 bytes per token, plus a small envelope
        assert 2 * 13 * n < len(data) < 2 * 13 * n + 1024


def test_arrays_given_as_lists_or_other_dtypes_are_packed_to_the_wire_dtype():
    s = Sample(tokens=[1, 2, 3], loss_mask=[0, 1, 1], logprobs=np.array([0, -1.5, -2.0]),
               versions=np.array([-1, 3, 3], dtype=np.int64), prompt_len=1)
    back = codec.decode(codec.encode(TrajectoryGroup(run="r", prompt_id="p", epoch=0, samples=[s])))
    got = back.samples[0]
    assert got.tokens.dtype == np.int32 and got.logprobs.dtype == np.float32 and got.versions.dtype == np.int32
    assert got.tokens.tolist() == [1, 2, 3] and got.logprobs.tolist() == [0, -1.5, -2.0]
    assert got.num_generated == 2 and got.oldest_version() == 3


# --- strictness -------------------------------------------------------------------------------------


def _group_bytes() -> bytes:
    s = Sample(tokens=np.arange(8, dtype=np.int32), loss_mask=np.ones(8, np.uint8),
               logprobs=np.zeros(8, np.float32), versions=np.zeros(8, np.int32))
    return codec.encode(TrajectoryGroup(run="r", prompt_id="p", epoch=0, samples=[s], metrics={"k": [1, 2]}))


def test_every_truncation_of_a_message_raises_decode_error():
    data = _group_bytes()
    for cut in range(len(data)):
        with pytest.raises(DecodeError):
            codec.decode(data[:cut])


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200))
def test_garbage_bytes_raise_decode_error_and_nothing_else(data):
    try:
        msg = codec.decode(data)
    except DecodeError:
        return
    assert type(msg) in codec.SCHEMAS.values()  # (astronomically unlikely) a valid message


@settings(max_examples=300, deadline=None)
@given(schema=st.sampled_from(sorted(codec.SCHEMAS)), fields=st.dictionaries(
    st.sampled_from(sorted({n for c in ALL_MESSAGES for n, _, _ in codec._field_specs(c)} | {"x"})),
    plain | st.lists(st.dictionaries(st.sampled_from(["tokens", "loss_mask", "logprobs", "versions", "prompt_len"]),
                                     plain | st.binary(max_size=9)), max_size=2), max_size=12),
    v=st.sampled_from([1, 1, 2, 0, -1, True, "1", None]))
def test_wrongly_typed_fields_raise_decode_error_and_nothing_else(schema, fields, v):
    data = msgpack.packb({**fields, "schema": schema, "v": v}, use_bin_type=True)
    try:
        msg = codec.decode(data)
    except DecodeError as exc:
        assert str(exc).split(":")[0].startswith(("message", schema))
        return
    assert type(msg) is codec.SCHEMAS[schema] and v == 1


def test_decode_error_names_the_message_and_the_field():
    raw = msgpack.unpackb(_group_bytes())
    raw["samples"][0]["tokens"] = b"\x00\x01\x02"  # not a whole number of int32s
    with pytest.raises(DecodeError) as info:
        codec.decode(msgpack.packb(raw))
    assert info.value.where == "TrajectoryGroup.samples[0].tokens"
    assert "3 bytes" in info.value.reason

    raw = msgpack.unpackb(_group_bytes())
    raw["samples"][0]["logprobs"] = b"\x00" * 4  # 1 logprob for 8 tokens
    with pytest.raises(DecodeError, match=r"TrajectoryGroup\.samples\[0\]\.logprobs: has 1 entries, tokens has 8"):
        codec.decode(msgpack.packb(raw))

    raw = msgpack.unpackb(_group_bytes())
    raw["epoch"] = True
    with pytest.raises(DecodeError, match=r"TrajectoryGroup\.epoch: expected int, got bool"):
        codec.decode(msgpack.packb(raw))

    raw = msgpack.unpackb(_group_bytes())
    del raw["run"]
    with pytest.raises(DecodeError, match=r"TrajectoryGroup\.run: required field is missing"):
        codec.decode(msgpack.packb(raw))


def test_message_of_an_unexpected_schema_is_refused():
    data = codec.encode(Event(run="r", service="s", kind="health"))
    with pytest.raises(DecodeError, match="got Event, expected TrajectoryGroup"):
        codec.decode(data, expect=TrajectoryGroup)
    assert isinstance(codec.decode(data, expect=(TrajectoryGroup, Event)), Event)


def test_newer_major_version_is_refused_with_a_clear_error():
    raw = codec.to_wire(Event(run="r", service="s", kind="health"))
    raw["v"] = Event.V + 1
    with pytest.raises(DecodeError) as info:
        codec.decode(msgpack.packb(raw, use_bin_type=True))
    assert info.value.where == "Event.v"
    assert "newer" in info.value.reason and "upgrade" in info.value.reason


def test_unknown_fields_are_kept_and_written_back():
    raw = msgpack.unpackb(_group_bytes())
    raw["added_in_a_later_minor"] = {"a": [1, 2]}
    raw["samples"][0]["sample_note"] = "kept"
    raw["samples"][0]["schema"] = "not-an-envelope-here"
    msg = codec.decode(msgpack.packb(raw, use_bin_type=True))
    assert msg.extra == {"added_in_a_later_minor": {"a": [1, 2]}}
    assert msg.samples[0].extra == {"sample_note": "kept", "schema": "not-an-envelope-here"}
    again = msgpack.unpackb(codec.encode(msg))
    assert again["added_in_a_later_minor"] == {"a": [1, 2]}
    assert again["samples"][0]["sample_note"] == "kept"
    assert again["samples"][0]["schema"] == "not-an-envelope-here"


def test_missing_optional_fields_take_their_defaults():
    msg = codec.decode(msgpack.packb({"schema": "PromptTask", "v": 1, "run": "r", "prompt_id": "p", "epoch": 0,
                                      "payload": {"prompt": "max 1 2 3 4 5 ="}}))
    assert (msg.group_size, msg.workflow, msg.sampling, msg.extra) == (1, "single_turn", {}, {})
    assert isinstance(msg.released_at, float)
    with pytest.raises(DecodeError, match=r"PromptTask\.group_size: must be >= 1"):
        codec.decode(msgpack.packb({"schema": "PromptTask", "v": 1, "run": "r", "prompt_id": "p", "epoch": 0,
                                    "payload": {}, "group_size": 0}))


def test_message_too_large_names_both_sizes():
    err = codec.MessageTooLarge("TrajectoryGroup", 2_000_000, 1_048_576, "jetrl.r.trajectories")
    assert "2000000 bytes" in str(err) and "1048576 bytes" in str(err) and "jetrl.r.trajectories" in str(err)
    assert (err.size, err.limit) == (2_000_000, 1_048_576)
