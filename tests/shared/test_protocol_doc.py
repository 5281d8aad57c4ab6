"""docs/protocol.md is the wire protocol for other languages: its examples must decode to what they claim.

For every message the doc carries, under `<!-- example:NAME -->`, a ```json block (the message with
packed arrays shown as lists of numbers and bytes as a hex string) and a ```msgpack-hex block (the exact
bytes on the wire). The tests decode every hex example with shared.contract.codec, compare it with its JSON,
check that every schema has an example and that every field of every message is in its field table.

Regenerate the examples after a schema change (then review the diff):
    python tests/shared/test_protocol_doc.py --write
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

import numpy as np

from shared.contract import codec
from shared.contract.messages import (
    DeadLetter,
    Event,
    PromptTask,
    RewardRequest,
    RewardResult,
    Sample,
    TrajectoryGroup,
    WeightVersion,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
EXAMPLE_RE = re.compile(r"<!-- example:(\w+) -->\s*```json\n(.*?)```\s*```msgpack-hex\n(.*?)```\s*<!-- /example -->",
                        re.S)


def example_messages() -> dict[str, object]:
    """One realistic message of each schema (fixed times and ids, so the doc is reproducible)."""
    prompt = "max 3 8 1 5 2 ="
    sample = Sample(
        tokens=np.array([12, 40, 7, 33, 21, 2], np.int32), loss_mask=np.array([0, 0, 0, 1, 1, 1], np.uint8),
        logprobs=np.array([0, 0, 0, -0.25, -1.5, -0.125], np.float32),
        versions=np.array([-1, -1, -1, 3, 3, 4], np.int32), prompt_len=3, reward=1.0, finish_reason="stop",
        turns=np.array([0], np.int32), timings={"generate": 0.5, "reward": 0.25}, metrics={"tool_calls": 0},
    )
    return {
        "PromptTask": PromptTask(
            run="demo", prompt_id="p000042", epoch=0, payload={"prompt": prompt, "reference": "8"},
            dataset="maxdigit", workflow="single_turn", group_size=4,
            sampling={"temperature": 1.0, "max_new_tokens": 4}, released_at_version=3, released_at=1796000000.25),
        "TrajectoryGroup": TrajectoryGroup(
            run="demo", prompt_id="p000042", epoch=0, samples=[sample], workflow="single_turn",
            worker="rollout-host1-7", released_at_version=3, created_at=1796000001.5, metrics={"reward_mean": 1.0}),
        "RewardRequest": RewardRequest(
            task="maxdigit", completions=[" 8", "5"], reference="8", payload={"prompt": prompt},
            request_id="6f1c2a9e", completion_ids=[np.array([1, 11], np.int32), np.array([8], np.int32)],
            timeout_s=10.0),
        "RewardResult": RewardResult(
            task="maxdigit", rewards=[1.0, 0.0], request_id="6f1c2a9e", metrics=[{"correct": True}, {"correct": False}],
            errors=[None, None], error=None, elapsed_s=0.125),
        "WeightVersion": WeightVersion(
            run="demo", version=4, step=4, manifest_url="http://127.0.0.1:8700/v1/runs/demo/versions/4/manifest",
            files=[{"name": "model.safetensors", "size": 563712, "sha256": "9b1d" + "0" * 60}],
            sha256="c0ff" + "e" * 60, created_at=1796000100.0),
        "Event": Event(
            run="demo", service="trainer", kind="step", instance="trainer-host1-9", time=1796000100.5,
            data={"version": 4, "step": 4, "loss": -0.03125, "reward_mean": 0.75, "samples": 32, "tokens": 1920,
                  "dropped_stale_samples": 0, "staleness_hist": {"0": 24, "1": 8}, "step_time_s": 1.5,
                  "tokens_per_s": 1280.0}),
        "DeadLetter": DeadLetter(
            run="demo", source="trainer", subject="jetrl.demo.trajectories",
            reason="decode error: message: expected a msgpack map, got list", original=b"\x92\x01\x02",
            delivery_count=1, stream="TRAJECTORIES", stream_seq=17, headers={"Nats-Msg-Id": "demo:0:p000017"},
            time=1796000200.0, original_size=3,
            original_sha256="f30d7cd2485f8205f1459c7a259121a5d54ae6875e3ddcfe76afbac9ebf95ba4"),
    }


def json_view(value):
    """A decoded message as the doc's JSON shows it: packed arrays as lists, bytes as hex strings."""
    if type(value) in codec.SCHEMAS.values() or type(value) in codec.NESTED.values():
        out = {"schema": value.SCHEMA, "v": value.V} if hasattr(value, "SCHEMA") else {}
        out.update({k: json_view(v) for k, v in value.extra.items()})
        out.update({name: json_view(getattr(value, name)) for name, _, _ in codec._field_specs(type(value))})
        return out
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {k: json_view(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_view(v) for v in value]
    return value


def pretty_json(value, indent: str = "") -> str:
    """Indented JSON with lists of scalars (token arrays) kept on one line."""
    inner = indent + "  "
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(k)}: {pretty_json(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        return "[\n" + ",\n".join(inner + pretty_json(v, inner) for v in value) + "\n" + indent + "]"
    return json.dumps(value)


def render_example(name: str, msg) -> str:
    hex_lines = "\n".join(textwrap.wrap(codec.encode(msg).hex(), 96))
    return (f"<!-- example:{name} -->\n```json\n{pretty_json(json_view(msg))}\n```\n\n"
            f"```msgpack-hex\n{hex_lines}\n```\n<!-- /example -->")


def doc_examples() -> dict[str, tuple[dict, bytes]]:
    return {m.group(1): (json.loads(m.group(2)), bytes.fromhex("".join(m.group(3).split())))
            for m in EXAMPLE_RE.finditer(DOC.read_text())}


def field_table(name: str) -> list[str]:
    """First-column field names of the table under `### NAME` in the doc."""
    text = DOC.read_text()
    start = text.index(f"\n### {name}\n")
    end = text.find("\n### ", start + 1)
    section = text[start:end if end > 0 else None]
    return re.findall(r"^\| `(\w+)` \|", section, re.M)


def test_every_message_has_an_example_in_the_doc():
    assert set(doc_examples()) == set(codec.SCHEMAS)


def test_every_hex_example_decodes_to_its_json_example():
    for name, (as_json, raw) in doc_examples().items():
        msg = codec.decode(raw)
        assert msg.SCHEMA == name
        assert json_view(msg) == as_json, name


def test_examples_are_what_this_codec_writes_today():
    examples = example_messages()
    for name, (_, raw) in doc_examples().items():
        assert raw == codec.encode(examples[name]), f"{name}: run `python {__file__} --write`"


def test_every_field_of_every_message_is_documented():
    for name, cls in {**codec.SCHEMAS, **codec.NESTED}.items():
        assert field_table(name) == [n for n, _, _ in codec._field_specs(cls)], name


def write_examples() -> None:
    text = DOC.read_text()
    for name, msg in example_messages().items():
        block = re.compile(rf"<!-- example:{name} -->.*?<!-- /example -->", re.S)
        assert block.search(text), f"no <!-- example:{name} --> ... <!-- /example --> in {DOC}"
        text = block.sub(lambda _m, n=name, m=msg: render_example(n, m), text)
    DOC.write_text(text)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_examples()
        print(f"examples written to {DOC}")
    else:
        print(__doc__)
