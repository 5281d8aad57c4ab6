"""The rollout viewer's API pages the retained TRAJECTORIES stream newest first, by stream sequence,
without reading it whole; text is decoded with the run's tokenizer into prompt, policy (with the
version that sampled each token) and tool segments."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from controller_helpers import AUTH, run_config

from shared.contract import codec, subjects
from shared.contract.messages import Sample, TrajectoryGroup
from shared.model.tinymodel import build_tokenizer

N = 10_000


def text_sample(tok, prompt: str, parts: list[tuple[str, int]], reward: float) -> Sample:
    """parts: (text, version) with version -1 for tool output (loss mask 0)."""
    ids = tok.encode(prompt, add_special_tokens=False)
    mask, vers = [0] * len(ids), [-1] * len(ids)
    plen = len(ids)
    for text, v in parts:
        t = tok.encode(text, add_special_tokens=False)
        ids += t
        mask += [1 if v >= 0 else 0] * len(t)
        vers += [v] * len(t)
    n = len(ids)
    return Sample(tokens=np.array(ids, np.int32), loss_mask=np.array(mask, np.uint8),
                  logprobs=np.zeros(n, np.float32), versions=np.array(vers, np.int32), prompt_len=plen, reward=reward)


async def publish_many(js, nc, run: str, n: int, tok, other_at: int) -> None:
    """n small groups (version = i // 100, reward 1 on every 1000th), in order on one connection (core
    publishes, stored by the stream in order), with another run's group after the `other_at`th."""
    for i in range(n):
        r = 1.0 if i % 1000 == 999 else 0.0
        g = TrajectoryGroup(run=run, prompt_id=f"p{i}", epoch=0,
                            samples=[text_sample(tok, f"max {i % 10} =", [(str(i % 10), i // 100)], r)])
        await nc.publish(subjects.trajectories(run), codec.encode(g))
        if i == other_at:
            og = TrajectoryGroup(run="other", prompt_id="x", epoch=0,
                                 samples=[text_sample(tok, "max 1 =", [("1", 0)], 1.0)])
            await nc.publish(subjects.trajectories("other"), codec.encode(og))
        if i % 1000 == 0:
            await nc.flush()
    await nc.flush()
    while (await js.stream_info(subjects.TRAJECTORIES_STREAM)).state.messages < n + 1:
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_viewer_pages_ten_thousand_trajectories_without_reading_the_stream_whole(live, js, nc, monkeypatch):
    assert (await live.http.post("/v1/runs", json=run_config("view", 1, 4), headers=AUTH)).status_code == 201
    assert (await live.http.post("/v1/runs", json=run_config("other", 1, 4), headers=AUTH)).status_code == 201
    tok = build_tokenizer()
    await publish_many(js, nc, "view", N, tok, other_at=N - 11)

    reads = []
    real_get = live.ctl.js.get_msg

    async def counting_get(*a, **kw):
        if kw.get("seq") is not None:  # one message by sequence (the newest is found by subject first)
            reads.append(kw["seq"])
        return await real_get(*a, **kw)

    monkeypatch.setattr(live.ctl.js, "get_msg", counting_get)

    page = (await live.http.get("/v1/runs/view/rollouts", params={"limit": 20})).json()
    # the other run's group, 10 messages back, is read and skipped
    assert [g["prompt_id"] for g in page["items"]] == [f"p{i}" for i in range(N - 1, N - 21, -1)]
    assert page["scanned"] == 21 and reads == list(range(N + 1, N - 20, -1)) and not page["exhausted"]
    g = page["items"][0]
    assert g["version"] == (N - 1) // 100 and g["seq"] == N + 1
    s = g["samples"][0]
    assert s["prompt"] == "max 9 =" and s["segments"] == [
        {"kind": "policy", "version": 99, "start": 7, "end": 8, "text": "9"}]
    seqs = [x["seq"] for x in page["items"]]
    assert seqs == sorted(seqs, reverse=True)

    reads.clear()
    nxt = (await live.http.get("/v1/runs/view/rollouts", params={"limit": 20, "before": page["next_before"]})).json()
    assert [x["prompt_id"] for x in nxt["items"]] == [f"p{i}" for i in range(N - 21, N - 41, -1)]
    assert len(reads) == 20

    # search by reward: only 10 of 10,000 have reward 1; each page reads at most `scan` messages
    reads.clear()
    hits = (await live.http.get("/v1/runs/view/rollouts", params={"min_reward": 1, "scan": 2500})).json()
    assert [x["prompt_id"] for x in hits["items"]] == ["p9999", "p8999", "p7999"]
    assert hits["scanned"] == 2500 and len(reads) == 2500 and hits["next_before"] == N + 2 - 2500
    more = (await live.http.get("/v1/runs/view/rollouts",
                                params={"min_reward": 1, "scan": 2500, "before": hits["next_before"]})).json()
    assert [x["prompt_id"] for x in more["items"]] == ["p6999", "p5999"]  # messages 7501 down to 5002

    # by version: the 100 groups of version 42, newest first
    v42 = (await live.http.get("/v1/runs/view/rollouts", params={"version": 42, "limit": 5, "scan": 10_000})).json()
    assert [x["prompt_id"] for x in v42["items"]] == [f"p{i}" for i in range(4299, 4294, -1)]
    by_prompt = (await live.http.get("/v1/runs/view/rollouts", params={"prompt": "p9990"})).json()
    assert [x["prompt_id"] for x in by_prompt["items"]] == ["p9990"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_viewer_marks_tool_tokens_and_the_version_of_every_policy_token(live, js, nc):
    assert (await live.http.post("/v1/runs", json=run_config("tools", 1, 4), headers=AUTH)).status_code == 201
    empty = (await live.http.get("/v1/runs/tools/rollouts")).json()
    assert empty == {"items": [], "next_before": None, "scanned": 0, "exhausted": True}
    tok = build_tokenizer()
    s = text_sample(tok, "q?", [("call(", 3), ("=42\n", -1), ("ans ", 3), ("42", 4)], 0.5)
    g = TrajectoryGroup(run="tools", prompt_id="t", epoch=0, samples=[s, text_sample(tok, "q?", [("x", 4)], -1.0)])
    await js.publish(subjects.trajectories("tools"), codec.encode(g))
    page = (await live.http.get("/v1/runs/tools/rollouts", params={"min_reward": 0})).json()
    (item,) = page["items"]
    assert item["version"] == 4 and len(item["samples"]) == 1  # the -1.0 sample is outside the range
    segs = [(x["kind"], x["version"], x["text"]) for x in item["samples"][0]["segments"]]
    assert segs == [("policy", 3, "call("), ("tool", -1, "=42\n"), ("policy", 3, "ans "), ("policy", 4, "42")]
    bad = await live.http.get("/v1/runs/tools/rollouts", params={"min_reward": 1, "max_reward": 0})
    assert bad.status_code == 422 and "swap" in bad.json()["detail"]
    assert (await live.http.get("/v1/runs/nope/rollouts")).status_code == 404


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_a_cursor_past_the_stream_end_reads_only_what_the_stream_holds(live, js, nc):
    assert (await live.http.post("/v1/runs", json=run_config("cur", 1, 4), headers=AUTH)).status_code == 201
    tok = build_tokenizer()
    for i in range(3):
        g = TrajectoryGroup(run="cur", prompt_id=f"p{i}", epoch=0, samples=[text_sample(tok, "q", [("a", 0)], 1.0)])
        await js.publish(subjects.trajectories("cur"), codec.encode(g))
    page = (await live.http.get("/v1/runs/cur/rollouts", params={"before": 2**62, "scan": 10_000})).json()
    assert [g["prompt_id"] for g in page["items"]] == ["p2", "p1", "p0"]
    assert page["scanned"] == 3 and page["exhausted"] and page["next_before"] is None


def test_the_viewer_decodes_from_tokenizer_json_without_importing_transformers(tmp_path):
    """A model dir's tokenizer.json (and the tiny tokenizer) decode through `tokenizers` alone, to the
    text transformers' tokenizer gives; importing transformers cost the controller ~4 s of CPU."""
    import subprocess
    import sys

    from shared.config import ModelConfig
    from shared.model.tinymodel import save_tiny

    model_dir = save_tiny(ModelConfig(), tmp_path / "m")
    tok = build_tokenizer()
    ids = tok.encode("Sort 3 1 2 -> 1 2 3!", add_special_tokens=False) + [tok.eos_token_id]
    code = (
        "import sys\n"
        "from controller.rollouts import load_decoder\n"
        f"print(load_decoder({str(model_dir)!r}).decode({ids!r}, skip_special_tokens=False))\n"
        f"print(load_decoder('').decode({ids!r}, skip_special_tokens=False))\n"
        "print('transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    want = tok.decode(ids, skip_special_tokens=False)
    assert out == [want, want, "False"]
