"""`jetrl weights export`: a version of a run as a directory to deploy. A full version is copied as it
is (a Hugging Face model dir); a LoRA version is copied as its PEFT adapter dir, or with `merge` merged
into the run's base model (`model.*`, checked against the adapter's base sha256) and written as a
Hugging Face model dir (config.json + safetensors + tokenizer) that any engine loads without peft."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from shared.config import JetrlConfig
from weight_store.client import WeightStoreClient
from weight_store.manifest import MANIFEST, kind


def _copy(src: Path, out: Path) -> None:
    for f in sorted(src.rglob("*")):
        if f.is_file() and not any(seg.startswith(".") for seg in f.relative_to(src).parts):  # not .delta/
            dest = out / f.relative_to(src)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest)


def merge_adapter_dir(cfg: JetrlConfig, adapter_dir: Path, out: Path) -> None:
    """Base model (`cfg.model`) + the adapter in `adapter_dir`, saved as a HF model dir in `out`."""
    from shared.model.adapters import check_version_base, merge_into
    from shared.model.tinymodel import load_policy, save_tokenizer

    check_version_base(adapter_dir, cfg.model)
    model, tokenizer = load_policy(cfg.model, "cpu")
    merge_into(model, adapter_dir)
    model.save_pretrained(out, safe_serialization=True)
    if cfg.model.path:
        tokenizer.save_pretrained(out)
    else:
        save_tokenizer(tokenizer, out / "tokenizer")


async def export_version(cfg: JetrlConfig, version: int, out: str | Path, merge: bool = False) -> dict:
    """Write version `version` of `cfg.run` to `out` (must not exist or be empty); returns a summary."""
    import asyncio

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    path = await WeightStoreClient(cfg.weights).fetch(cfg.run, version)
    manifest = json.loads((Path(path) / MANIFEST).read_bytes())
    k = kind(manifest)
    if k == "lora" and merge:
        await asyncio.to_thread(merge_adapter_dir, cfg, Path(path), out)
        what = "merged"
    else:
        await asyncio.to_thread(_copy, Path(path), out)
        (out / MANIFEST).unlink(missing_ok=True)
        what = "adapter" if k == "lora" else "full"
    return {"run": cfg.run, "version": version, "kind": k, "wrote": what, "out": str(out)}
