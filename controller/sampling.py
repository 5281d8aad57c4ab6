"""`launch.sampling: learnable-first`: which rows of an epoch the releaser sends next.

Within the epoch an enqueue is in, among the rows not yet released in that epoch, the prompts whose last
observation had signal go first, then unseen ones, then seen ones without signal, then never-solved, then
always-solved (memory.py CLASSES, read from the prompt memory of every run); ties keep the epoch's own
order (the seeded permutation, or file order). Only the order within an epoch changes: the enqueue's
cursor still counts releases, so epochs, `limit` and the run's total are those of `uniform`.

Exactly once per epoch: the rows released in an epoch are the ledger's rows of (enqueue, epoch), read once
into a mask and extended only after `ledger.reserve` committed a batch (`commit`), so a plan that failed to
commit leaves no trace and a restarted releaser (`reset`) reads the ledger again. The memory is re-read at
most every MEMORY_REFRESH_S, only the rows changed since the last read (plus REREAD_SLACK_S for
transactions that committed late); the per-epoch order is re-sorted only when a class changed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import select

from controller.db import Ledger
from controller.memory import RANK, UNSEEN, classes_since

log = logging.getLogger("jetrl.controller.sampling")

MEMORY_REFRESH_S = 1.5
REREAD_SLACK_S = 30.0


def learnable_first(rows: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """`rows` (an epoch's order) stably sorted by the rank of each row's class."""
    return rows[np.argsort(ranks[rows], kind="stable")]


def next_unreleased(order: np.ndarray, released: np.ndarray, k: int) -> np.ndarray:
    """The first `k` rows of `order` not marked in `released` (a bool mask by row index)."""
    return order[~released[order]][:k]


def row_of(prompt_id: str) -> int | None:
    """The row index of a prompt id `<hash[:12]>-<row>`."""
    tail = prompt_id.rpartition("-")[2]
    return int(tail) if tail.isascii() and tail.isdigit() and len(tail) < 10 else None


@dataclass
class Ranks:
    """One dataset's class rank per row (UNSEEN until the memory says otherwise)."""

    size: int
    rank: np.ndarray = field(init=False)
    generation: int = 0  # bumped whenever a rank changes
    read_at: float | None = None  # wall time of the last read (None: never read)
    checked: float = float("-inf")  # monotonic time of the last read

    def __post_init__(self):
        self.rank = np.full(self.size, RANK[UNSEEN], np.int8)


class LearnableFirst:
    def __init__(self, Session_, run_id: str, refresh_s: float = MEMORY_REFRESH_S):  # noqa: N803
        self.Session, self.run_id, self.refresh_s = Session_, run_id, refresh_s
        self.reset()

    def reset(self) -> None:
        """Forget every cache: a (re)started release loop reads the ledger and the memory again."""
        self.ranks: dict[str, Ranks] = {}
        self.released: dict[tuple[int, int], np.ndarray] = {}
        self.orders: dict[tuple[int, int], tuple[int, np.ndarray]] = {}

    # --- reads --------------------------------------------------------------------------------
    def _ranks(self, key: str, size: int) -> Ranks:
        r = self.ranks.get(key)
        if r is None or r.size < size:
            r = self.ranks[key] = Ranks(size)
        t = time.monotonic()
        if t - r.checked < self.refresh_s:
            return r
        wall = time.time()
        since = float("-inf") if r.read_at is None else r.read_at - REREAD_SLACK_S
        with self.Session() as s:
            changed = classes_since(s, key, since)
        for pid, cls in changed:
            i = row_of(pid)
            if i is not None and i < r.size and r.rank[i] != RANK[cls]:
                r.rank[i] = RANK[cls]
                r.generation += 1
        r.read_at, r.checked = wall, t
        return r

    def _released(self, enq, epoch: int, expected: int) -> np.ndarray:
        key = (enq.id, epoch)
        mask = self.released.get(key)
        if mask is None:
            mask = np.zeros(enq.rows_per_epoch, bool)
            with self.Session() as s:
                idx = list(s.scalars(select(Ledger.row_index).where(
                    Ledger.run_id == self.run_id, Ledger.enqueue_id == enq.id, Ledger.epoch == epoch)))
            mask[idx] = True
            if len(self.released) > 64:  # finished epochs
                self.released.clear()
            self.released[key] = mask
        n = int(mask.sum())
        if n != expected:  # the ledger and the cursor commit together: this cannot happen
            raise RuntimeError(f"run {self.run_id}: enqueue {enq.id} epoch {epoch}: the ledger holds {n} rows "
                               f"and the cursor says {expected} were released")
        return mask

    # --- the plan -----------------------------------------------------------------------------
    def next_rows(self, enq, content_hash: str, want: int, epoch_rows) -> list[tuple[int, int]]:
        """(epoch, row index) of the enqueue's next `want` releases (fewer at its end). `epoch_rows(enq,
        local_epoch)` is the epoch's own order (release.py)."""
        out: list[tuple[int, int]] = []
        pos = enq.next_pos
        ranks = self._ranks(content_hash[:12], enq.rows_per_epoch)
        while pos < enq.total and len(out) < want:
            local_epoch, k = divmod(pos, enq.rows_per_epoch)
            epoch = enq.epoch_offset + local_epoch
            released = self._released(enq, epoch, k)
            cached = self.orders.get((enq.id, local_epoch))
            if cached is None or cached[0] != ranks.generation:
                if len(self.orders) > 64:
                    self.orders.clear()
                cached = self.orders[(enq.id, local_epoch)] = (
                    ranks.generation, learnable_first(np.asarray(epoch_rows(enq, local_epoch)), ranks.rank))
            take = next_unreleased(cached[1], released, min(want - len(out), enq.rows_per_epoch - k))
            out.extend((epoch, int(i)) for i in take)
            pos += len(take)
            if not len(take):
                break
        return out

    def commit(self, rows: list[dict]) -> None:
        """Mark rows released once their ledger batch committed."""
        for r in rows:
            mask = self.released.get((r["enqueue_id"], r["epoch"]))
            if mask is not None:
                mask[r["row_index"]] = True
