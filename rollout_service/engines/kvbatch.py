"""A left-padded batched KV cache that sequences join and leave between decode steps.

All running sequences share one transformers DynamicCache of shape [batch, heads, length, head_dim] per
layer. Row i belongs to one sequence; its real tokens are right-aligned and `mask[i]` marks them (the
left part is padding the attention mask hides). Joining (after a batched prefill) left-pads the shorter
of the two caches and concatenates rows; leaving selects the remaining rows and trims columns that are
padding in every row. Only a membership change copies the cache; a decode step appends one column.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _cache_tensors(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _make_cache(kv: list[tuple[torch.Tensor, torch.Tensor]]):
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=kv)


def select_rows(cache, idx: torch.Tensor):
    """A cache of rows `idx` of `cache` (rows may repeat: copies of one prefill for several sequences)."""
    return _make_cache([(k.index_select(0, idx), v.index_select(0, idx)) for k, v in _cache_tensors(cache)])


class KVBatch:
    """Rows of running sequences: the cache, its padding mask and each row's next position id."""

    def __init__(self) -> None:
        self.cache = None
        self.mask: torch.Tensor | None = None  # [B, L] long, 1 = a real token
        self.next_pos: torch.Tensor | None = None  # [B] long, position id of the row's next token

    @property
    def size(self) -> int:
        return 0 if self.mask is None else int(self.mask.shape[0])

    @property
    def length(self) -> int:
        return 0 if self.mask is None else int(self.mask.shape[1])

    def clear(self) -> None:
        self.cache = self.mask = self.next_pos = None

    def append(self, cache, mask: torch.Tensor) -> None:
        """Add rows (a prefilled cache and its [b, L] mask) after the existing ones."""
        next_pos = mask.sum(dim=1)
        if self.cache is None:
            self.cache, self.mask, self.next_pos = cache, mask, next_pos
            return
        length = max(self.length, int(mask.shape[1]))
        old = self._left_pad(_cache_tensors(self.cache), self.mask, length)
        new = self._left_pad(_cache_tensors(cache), mask, length)
        kv = [
            (torch.cat([ko, kn]), torch.cat([vo, vn]))
            for (ko, vo), (kn, vn) in zip(old[0], new[0], strict=True)
        ]
        self.cache = _make_cache(kv)
        self.mask = torch.cat([old[1], new[1]])
        self.next_pos = torch.cat([self.next_pos, next_pos])

    @staticmethod
    def _left_pad(kv, mask: torch.Tensor, length: int):
        pad = length - int(mask.shape[1])
        if pad == 0:
            return kv, mask
        kv = [(F.pad(k, (0, 0, pad, 0)), F.pad(v, (0, 0, pad, 0))) for k, v in kv]
        return kv, F.pad(mask, (pad, 0))

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (in this order); drop columns that became padding everywhere."""
        if not rows:
            self.clear()
            return
        if rows == list(range(self.size)):
            return
        idx = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        mask = self.mask.index_select(0, idx)
        first = int(torch.nonzero(mask.any(dim=0))[0]) if mask.any() else 0
        kv = [
            (k.index_select(0, idx)[:, :, first:], v.index_select(0, idx)[:, :, first:])
            for k, v in _cache_tensors(self.cache)
        ]
        self.cache = _make_cache(kv)
        self.mask = mask[:, first:]
        self.next_pos = self.next_pos.index_select(0, idx)

    def step_inputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(attention_mask [B, L+1], position_ids [B, 1]) for decoding one new token per row."""
        ones = torch.ones((self.size, 1), dtype=self.mask.dtype, device=self.mask.device)
        return torch.cat([self.mask, ones], dim=1), self.next_pos.unsqueeze(1)

    def advance(self, attention_mask: torch.Tensor) -> None:
        """After a decode step: the step's mask becomes the cache mask, positions move by one."""
        self.mask = attention_mask
        self.next_pos = self.next_pos + 1
