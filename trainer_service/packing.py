"""Sequence packing: samples -> micro-batches within a token budget -> one flat row per micro-batch.

No padding compute: the sequences of a micro-batch are concatenated into one row of shape [1, T];
`position_ids` restart at 0 for each sequence, which makes the attention block-diagonal (transformers
builds the block mask from position_ids for sdpa/eager, flash-attention uses varlen kernels), so no
sequence attends across a boundary. Targets are shifted inside each sequence: the logits at position
t score token t+1 of the same sequence; the last position of every sequence scores nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class TrainItem:
    """One sample ready to train: token arrays plus its advantage and loss coefficient."""

    tokens: np.ndarray  # int, [L]
    loss_mask: np.ndarray  # 0/1, [L]
    behav_logp: np.ndarray  # float, [L]
    advantage: float
    coef: float = 0.0  # weight of each of its loss tokens in the batch loss (token_coefficients)
    group_id: str = ""
    reward: float = 0.0
    staleness: int = 0

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def num_loss_tokens(self) -> int:
        # Token 0 can never be scored (nothing predicts it).
        return int(np.count_nonzero(self.loss_mask[1:]))


@dataclass
class PackedBatch:
    """One micro-batch: flat row of T tokens. Per-position arrays describe the *target* token t+1."""

    input_ids: torch.Tensor  # [1, T] long
    position_ids: torch.Tensor  # [1, T] long
    targets: torch.Tensor  # [T] long (0 where nothing is scored)
    mask: torch.Tensor  # [T] float: 1 where the target is a policy token of the same sequence
    behav_logp: torch.Tensor  # [T]
    advantages: torch.Tensor  # [T]
    coef: torch.Tensor  # [T]
    cu_seqlens: torch.Tensor  # [n+1] int32 sequence boundaries
    seq_index: torch.Tensor  # [T] long: which sequence of the micro-batch each position belongs to
    lengths: list[int] = field(default_factory=list)
    # Shared-prompt packing (pack_shared): one (start, prefix_len, [branch lengths]) per segment of the
    # row: the prefix once, then each branch, which attends to the prefix and causally to itself.
    segments: list[tuple[int, int, list[int]]] | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def to(self, device: str | torch.device) -> PackedBatch:
        kw = {k: getattr(self, k).to(device) for k in ("input_ids", "position_ids", "targets", "mask", "behav_logp",
                                                        "advantages", "coef", "cu_seqlens", "seq_index")}
        return PackedBatch(lengths=self.lengths, segments=self.segments, **kw)


def plan_micro_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices of items per micro-batch, each micro-batch <= `budget` tokens (first-fit decreasing).

    A sequence longer than the budget gets a micro-batch of its own (it cannot be split).
    """
    if budget < 1:
        raise ValueError(f"token budget must be >= 1, got {budget}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = lengths[i]
        for b, free in enumerate(room):
            if n <= free:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(budget - n)
    return [sorted(b) for b in bins]


def split_for_ranks(lengths: Sequence[int], world: int) -> list[list[int]]:
    """Balance items over `world` data-parallel ranks by tokens (longest first onto the lightest rank)."""
    shares: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        r = min(range(world), key=lambda k: (load[k], k))
        shares[r].append(i)
        load[r] += lengths[i]
    return [sorted(s) for s in shares]


class _Row:
    """The per-position arrays of one packed row, filled piece by piece (`pack`, `pack_shared`)."""

    def __init__(self) -> None:
        self.ids, self.pos, self.tgt, self.msk, self.blp, self.adv, self.cof, self.seq = ([] for _ in range(8))

    def add_tokens(self, it: TrainItem, k: int, start: int) -> int:
        """Item k's tokens from `start` on, at positions start.., each scoring the next token of the item
        (the last scores nothing). Returns how many positions were added."""
        n = it.length - start
        toks = np.asarray(it.tokens[start:], dtype=np.int64)
        self.ids.append(toks)
        self.pos.append(np.arange(start, start + n, dtype=np.int64))
        self.tgt.append(np.concatenate([toks[1:], [0]]))
        self.msk.append(np.concatenate([np.asarray(it.loss_mask[start + 1:], dtype=np.float32), [0.0]]).astype(np.float32))
        self.blp.append(np.concatenate([np.asarray(it.behav_logp[start + 1:], dtype=np.float32), [0.0]]))
        self.adv.append(np.full(n, it.advantage, dtype=np.float32))
        self.cof.append(np.full(n, it.coef, dtype=np.float32))
        self.seq.append(np.full(n, k, dtype=np.int64))
        return n

    def add_prefix(self, it: TrainItem, k: int, s: int) -> None:
        """The first `s` tokens of item k (a group's shared prompt): positions 0..s-1, scoring nothing."""
        toks = np.asarray(it.tokens[:s], dtype=np.int64)
        self.ids.append(toks)
        self.pos.append(np.arange(s, dtype=np.int64))
        self.tgt.append(np.concatenate([toks[1:], [np.int64(it.tokens[s])]]))
        for arr in (self.msk, self.blp, self.adv, self.cof):
            arr.append(np.zeros(s, dtype=np.float32))
        self.seq.append(np.full(s, k, dtype=np.int64))

    def batch(self, cu: list[int], lengths: list[int], segments=None) -> PackedBatch:
        t = torch.from_numpy
        return PackedBatch(
            input_ids=t(np.concatenate(self.ids))[None],
            position_ids=t(np.concatenate(self.pos))[None],
            targets=t(np.concatenate(self.tgt)),
            mask=t(np.concatenate(self.msk)),
            behav_logp=t(np.concatenate(self.blp)),
            advantages=t(np.concatenate(self.adv)),
            coef=t(np.concatenate(self.cof)),
            cu_seqlens=torch.tensor(cu, dtype=torch.int32),
            seq_index=t(np.concatenate(self.seq)),
            lengths=lengths,
            segments=segments,
        )


def pack(items: Sequence[TrainItem]) -> PackedBatch:
    """Concatenate `items` into one row with per-sequence positions and shifted targets."""
    if not items:
        raise ValueError("cannot pack an empty micro-batch")
    row, cu = _Row(), [0]
    for k, it in enumerate(items):
        cu.append(cu[-1] + row.add_tokens(it, k, 0))
    return row.batch(cu, [it.length for it in items])


def first_loss_index(it: TrainItem) -> int:
    """Index of the first token with loss_mask 1 (len(tokens) if none)."""
    nz = np.flatnonzero(np.asarray(it.loss_mask))
    return int(nz[0]) if len(nz) else it.length


def shared_prefix_length(items: Sequence[TrainItem]) -> int:
    """Tokens the items can share as one packed prefix: their longest common prefix, stopped one token
    before the first loss token of any of them and one token short of it, so that every item keeps its
    last prompt token (whose position scores the item's first generated token) in its own branch.
    0 = nothing to share (one item, or no common prefix)."""
    if len(items) < 2:
        return 0
    stop = min(first_loss_index(it) for it in items)
    first = np.asarray(items[0].tokens)
    common = min(stop, *(it.length for it in items))
    for it in items[1:]:
        diff = np.flatnonzero(np.asarray(it.tokens[:common]) != first[:common])
        if len(diff):
            common = int(diff[0])
    return max(0, common - 1)


def prompt_groups(items: Sequence[TrainItem]) -> list[list[int]]:
    """Indices of items by group_id (in first-seen order); items without a group_id stand alone."""
    by: dict[str, list[int]] = {}
    out: list[list[int]] = []
    for i, it in enumerate(items):
        if not it.group_id:
            out.append([i])
        elif it.group_id in by:
            by[it.group_id].append(i)
        else:
            by[it.group_id] = [i]
            out.append(by[it.group_id])
    return out


def shared_cost(items: Sequence[TrainItem]) -> int:
    """Tokens of `items` packed with their shared prefix once."""
    s = shared_prefix_length(items)
    return s + sum(it.length - s for it in items)


def plan_shared_micro_batches(items: Sequence[TrainItem], budget: int) -> list[list[int]]:
    """Micro-batches (item indices) keeping each prompt group together where it fits in `budget` tokens
    counted with its prefix once; a larger group is cut into consecutive parts that fit (each part
    carries the prefix again), so a group may span micro-batches. Parts are then binned first-fit
    decreasing like plan_micro_batches."""
    units: list[list[int]] = []
    for g in prompt_groups(items):
        part: list[int] = []
        for i in g:
            if part and shared_cost([items[j] for j in part + [i]]) > budget:
                units.append(part)
                part = []
            part.append(i)
        units.append(part)
    cost = [shared_cost([items[j] for j in u]) for u in units]
    plan = plan_micro_batches(cost, budget)  # a micro-batch of units: their costs simply add up
    return [sorted(j for u in b for j in units[u]) for b in plan]


def pack_shared(items: Sequence[TrainItem]) -> PackedBatch:
    """Like `pack`, but each prompt group's shared prefix (shared_prefix_length) is packed once: the row
    holds, per group, the prefix (positions 0..S-1) then every item's remaining tokens (positions S..),
    and `segments` tells the attention that each branch sees the prefix and itself. Per-position arrays
    describe target t+1 within the branch; prefix positions score nothing (mask 0)."""
    if not items:
        raise ValueError("cannot pack an empty micro-batch")
    row = _Row()
    segments: list[tuple[int, int, list[int]]] = []
    cu, start = [0], 0
    for g in prompt_groups(items):
        group = [items[i] for i in g]
        s = shared_prefix_length(group)
        if s:
            row.add_prefix(group[0], g[0], s)
        branches = [row.add_tokens(it, k, s) for k, it in zip(g, group, strict=True)]
        segments.append((start, s, branches))
        start += s + sum(branches)
        cu.append(start)
    return row.batch(cu, [s + sum(b) for _, s, b in segments], segments)


def dummy_item(length: int = 2) -> TrainItem:
    """A zero-weight micro-batch filler: ranks must run the same number of forward/backward passes
    (FSDP collectives), so a rank with fewer micro-batches runs this (coef 0, no gradient effect)."""
    return TrainItem(tokens=np.zeros(length, dtype=np.int32), loss_mask=np.zeros(length, dtype=np.uint8),
                     behav_logp=np.zeros(length, dtype=np.float32), advantage=0.0, coef=0.0)
