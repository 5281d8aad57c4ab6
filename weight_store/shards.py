"""Safetensors shards streamed straight from tensor memory (no serialised copy of the state dict).

The safetensors format is an 8-byte little-endian header length, a JSON header
{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}} padded with spaces to a
multiple of 8, then the raw bytes of every tensor back to back. `Shard.buffers()` yields the header
and then memoryviews of each tensor's own storage, so a 1 GiB state dict is uploaded without being
copied once in Python. Files are named as Hugging Face names them (model-00001-of-00004.safetensors
plus model.safetensors.index.json), so `from_pretrained` loads a fetched dir.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch

DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}
for _name, _code in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):
    if hasattr(torch, _name):
        DTYPES[getattr(torch, _name)] = _code
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


@dataclass
class Shard:
    name: str
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    header: bytes = b""
    size: int = 0

    def build(self, metadata: Mapping[str, str] | None = None) -> Shard:
        entries: dict = {"__metadata__": {"format": "pt", **(metadata or {})}}
        pos = 0
        for key, t in self.tensors.items():
            n = t.numel() * t.element_size()
            entries[key] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [pos, pos + n]}
            pos += n
        js = json.dumps(entries, separators=(",", ":")).encode()
        js += b" " * (-len(js) % 8)
        self.header = struct.pack("<Q", len(js)) + js
        self.size = len(self.header) + pos
        return self

    def buffers(self, chunk: int = 8 << 20):
        """A factory of the shard's bytes as memoryviews of at most `chunk` bytes (for retries)."""

        def gen() -> Iterator[memoryview]:
            yield memoryview(self.header)
            for t in self.tensors.values():
                if t.numel() == 0:
                    continue
                mv = memoryview(t.reshape(-1).view(torch.uint8).numpy())
                for i in range(0, len(mv), chunk):
                    yield mv[i : i + chunk]

        return gen


def _cpu_contiguous(name: str, t: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"state dict entry {name!r} is a {type(t).__name__}, not a torch.Tensor")
    if t.dtype not in DTYPES:
        raise TypeError(f"state dict entry {name!r} has dtype {t.dtype}, which safetensors cannot store")
    return t.detach().to("cpu").contiguous()


def plan_shards(state_dict: Mapping[str, torch.Tensor], max_bytes: int,
                metadata: Mapping[str, str] | None = None) -> list[Shard]:
    """Split a state dict, in order, into shards of at most `max_bytes` of tensor data
    (a single tensor larger than that gets a shard of its own)."""
    if not state_dict:
        raise ValueError("cannot publish an empty state dict")
    groups: list[dict[str, torch.Tensor]] = [{}]
    used = 0
    for name, t in state_dict.items():
        t = _cpu_contiguous(name, t)
        n = t.numel() * t.element_size()
        if groups[-1] and used + n > max_bytes:
            groups.append({})
            used = 0
        groups[-1][name] = t
        used += n
    total = len(groups)
    names = [SINGLE_NAME] if total == 1 else [f"model-{i + 1:05d}-of-{total:05d}.safetensors" for i in range(total)]
    return [Shard(n, g).build(metadata) for n, g in zip(names, groups, strict=True)]


def index_json(shards: list[Shard]) -> bytes:
    """model.safetensors.index.json for a sharded state dict (as transformers writes it)."""
    total = sum(t.numel() * t.element_size() for s in shards for t in s.tensors.values())
    weight_map = {k: s.name for s in shards for k in s.tensors}
    return json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2).encode()


def dtype_of(state_dict: Mapping[str, torch.Tensor]) -> str:
    """The dtype of the floating-point tensors ('mixed' if several), as a manifest records it."""
    kinds = {str(t.dtype).removeprefix("torch.") for t in state_dict.values() if t.is_floating_point()}
    return kinds.pop() if len(kinds) == 1 else ("mixed" if kinds else "")
