"""The rollout viewer's reads (GET /v1/runs/{run}/rollouts): what the model wrote, newest first.

Trajectory groups are read from the retained TRAJECTORIES stream one message at a time, by stream
sequence, walking backwards from the run's newest message (or from the `before` cursor): a page reads at
most `scan` messages whatever the stream holds, and returns `next_before` to continue. Filters (the
group's policy version, the prompt id, a reward range per sample) apply while walking. Token ids are
decoded with the run's tokenizer (model.tokenizer / model.path of the run's config; the tiny one when
both are empty) into segments of consecutive tokens with the same kind and version: the prompt, policy
tokens (`version` = the policy that sampled them) and environment / tool tokens (loss mask 0).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from nats.js.errors import NotFoundError

from shared.contract import codec, subjects
from shared.contract.messages import TrajectoryGroup

log = logging.getLogger("jetrl.controller.rollouts")

MAX_TEXT = 20_000  # characters of one segment sent to the browser


@dataclass
class RolloutQuery:
    version: int | None = None
    prompt: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    before: int | None = None  # stream sequence: read messages below it (None = from the newest)
    limit: int = 20  # groups per page
    scan: int = 1000  # messages read at most per page


def group_version(g: TrajectoryGroup) -> int:
    """The newest policy version among the group's generated tokens (-1: none generated)."""
    vs = [int(s.versions[s.loss_mask.astype(bool)].max()) for s in g.samples if s.num_generated]
    return max(vs) if vs else -1


def segments(tokens: np.ndarray, loss_mask: np.ndarray, versions: np.ndarray, prompt_len: int) -> list[dict]:
    """Runs of tokens after the prompt with the same (kind, version): kind "policy" (loss mask 1) or
    "tool" (loss mask 0: environment / tool output, not trained); [{kind, version, start, end}]."""
    out: list[dict] = []
    for i in range(prompt_len, len(tokens)):
        kind = "policy" if loss_mask[i] else "tool"
        v = int(versions[i]) if loss_mask[i] else -1
        if out and out[-1]["kind"] == kind and out[-1]["version"] == v:
            out[-1]["end"] = i + 1
        else:
            out.append({"kind": kind, "version": v, "start": i, "end": i + 1})
    return out


def load_decoder(name: str):
    """A tokenizer to decode with: the `tokenizers` library straight from the dir's tokenizer.json (the
    tiny one when `name` is empty), so the controller never imports transformers for the viewer (that
    import alone took ~4 s of CPU beside a running trainer, bench/tracking.py). transformers' tokenizer
    only for a name without a tokenizer.json (a hub id, a slow tokenizer). Its decode is the fast
    tokenizer's own; transformers' clean-up of spaces around punctuation (off for BPE) is not applied."""
    from shared.model.tinymodel import TINY_MARKER, load_tokenizer, tiny_tokenizer_object

    if not name:
        return tiny_tokenizer_object()
    p = Path(name)
    d = p / "tokenizer" if (p / "tokenizer" / TINY_MARKER).exists() else p
    if (d / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(d / "tokenizer.json"))
    return load_tokenizer(name)


class Tokenizers:
    """One tokenizer per run config, loaded on first use (None when it cannot be loaded: ids only)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], object] = {}
        self._lock = threading.Lock()

    def get(self, model_cfg: dict):
        key = (str(model_cfg.get("tokenizer") or ""), str(model_cfg.get("path") or ""))
        with self._lock:
            if key not in self._cache:
                try:
                    self._cache[key] = load_decoder(key[0] or key[1])
                except Exception as exc:
                    log.warning("rollout viewer: cannot load tokenizer %r (%s); showing token ids", key, exc)
                    self._cache[key] = None
            return self._cache[key]


def _in_range(reward: float, q: RolloutQuery) -> bool:
    return (q.min_reward is None or reward >= q.min_reward) and (q.max_reward is None or reward <= q.max_reward)


def _decode(tok, ids: np.ndarray) -> str | None:
    if tok is None:
        return None
    return tok.decode([int(x) for x in ids], skip_special_tokens=False)[:MAX_TEXT]


def group_view(g: TrajectoryGroup, seq: int, tok, q: RolloutQuery) -> dict | None:
    """One group as the viewer shows it (samples outside the reward range left out; None if none is left)."""
    samples = []
    for i, s in enumerate(g.samples):
        if not _in_range(s.reward, q):
            continue
        segs = segments(s.tokens, s.loss_mask, s.versions, s.prompt_len)
        for seg in segs:
            ids = s.tokens[seg["start"]:seg["end"]]
            seg["text"] = _decode(tok, ids)
            if seg["text"] is None:
                seg["ids"] = [int(x) for x in ids[:2000]]
        samples.append({"index": i, "reward": float(s.reward), "finish_reason": s.finish_reason,
                        "prompt_len": s.prompt_len, "tokens": len(s.tokens), "generated": s.num_generated,
                        "prompt": _decode(tok, s.tokens[:s.prompt_len]), "segments": segs,
                        "timings": s.timings, "metrics": s.metrics})
    if not samples:
        return None
    return {"seq": seq, "group_id": g.group_id, "prompt_id": g.prompt_id, "epoch": g.epoch, "worker": g.worker,
            "workflow": g.workflow, "created_at": g.created_at, "released_at_version": g.released_at_version,
            "version": group_version(g), "samples": samples}


async def read_page(js, run: str, q: RolloutQuery, model_cfg: dict, tokenizers: Tokenizers, to_thread) -> dict:
    """A page of groups, newest first: {"items", "next_before", "scanned", "exhausted"}."""
    subject = subjects.trajectories(run)
    state = (await js.stream_info(subjects.TRAJECTORIES_STREAM)).state
    first = max(1, state.first_seq)  # below it the stream holds nothing any more
    if q.before is None:
        try:
            last = await js.get_last_msg(subjects.TRAJECTORIES_STREAM, subject)
        except NotFoundError:
            return {"items": [], "next_before": None, "scanned": 0, "exhausted": True}
        seq = last.seq
    else:
        seq = min(q.before - 1, state.last_seq)
    found: list[tuple[int, TrajectoryGroup]] = []
    scanned = 0
    while seq >= first and len(found) < q.limit and scanned < q.scan:
        scanned += 1
        try:
            m = await js.get_msg(subjects.TRAJECTORIES_STREAM, seq=seq)
        except NotFoundError:  # deleted since the stream info was read
            seq -= 1
            continue
        cur, seq = seq, seq - 1
        if m.subject != subject:
            continue  # another run's group
        try:
            g = codec.decode(m.data, TrajectoryGroup)
        except codec.DecodeError:
            continue  # the trainer dead-letters it; the viewer skips it
        if (q.version is not None and group_version(g) != q.version) or (q.prompt is not None and g.prompt_id != q.prompt):
            continue
        if not any(_in_range(s.reward, q) for s in g.samples):
            continue
        found.append((cur, g))

    def views() -> list[dict]:
        tok = tokenizers.get(model_cfg)
        return [v for cur, g in found if (v := group_view(g, cur, tok, q)) is not None]

    items = await to_thread(views) if found else []
    done = seq < first
    return {"items": items, "next_before": None if done else seq + 1, "scanned": scanned, "exhausted": done}
