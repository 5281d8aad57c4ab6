"""LoRA adapter versions, the part the trainer (writes them) and the rollout workers / eval (apply them)
share: which base model an adapter belongs to, the adapter dir format, and the merge maths.

An adapter version is a PEFT adapter dir, loadable by `peft`, vLLM and SGLang as is:

    adapter_config.json          peft's LoraConfig (r, lora_alpha, target_modules, modules_to_save, ...)
    adapter_model.safetensors    <prefix><module>.lora_A.weight [r, in], <prefix><module>.lora_B.weight [out, r],
                                 and <prefix><module>.weight for each of modules_to_save (full copies)

(<prefix> = `base_model.model.`). Its manifest in the weight store says `kind: lora` and names the base
(`adapter`: base_model, base_sha256, rank, alpha, target_modules, modules_to_save; docs/protocol.md).

`base_fingerprint(model_cfg)` identifies a base model by content, the same on every host: the sha256 of
its safetensors files (a model dir or a cached hub id) or, for the tiny model, of its tensors. A worker
compares it with the adapter's `base_sha256` and refuses a mismatch.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from shared.config import ModelConfig

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."


class BaseMismatch(ValueError):
    """An adapter trained on another base model than the one this process serves."""


@dataclass(frozen=True)
class BaseModel:
    """A base model's identity: `id` names it for people (config path or tiny shape), `sha256` decides."""

    id: str
    sha256: str


def _tensor_digest(sd: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(sd):
        t = sd[k].detach().cpu().contiguous()
        h.update(f"{k}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _files_digest(d: Path) -> str:
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{d}: no *.safetensors files to identify the base model by")
    h = hashlib.sha256()
    for f in files:
        fh = hashlib.sha256()
        with open(f, "rb") as src:
            for chunk in iter(lambda: src.read(8 << 20), b""):
                fh.update(chunk)
        h.update(f"{f.name}|{fh.hexdigest()}\n".encode())
    return h.hexdigest()


def _model_dir(path: str) -> Path:
    p = Path(path)
    if p.is_dir():
        return p
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(path, local_files_only=True, allow_patterns=["*.safetensors", "*.json"]))


@functools.lru_cache(maxsize=8)
def _fingerprint(path: str, layers: int, hidden: int, heads: int, seed: int) -> BaseModel:
    if path:
        return BaseModel(path, _files_digest(_model_dir(path)))
    from shared.model.tinymodel import build_tiny_model

    cfg = ModelConfig(tiny_layers=layers, tiny_hidden=hidden, tiny_heads=heads, seed=seed)
    model, _ = build_tiny_model(cfg)
    return BaseModel(f"tiny(layers={layers},hidden={hidden},heads={heads},seed={seed})",
                     _tensor_digest(model.state_dict()))


def base_fingerprint(cfg: ModelConfig) -> BaseModel:
    """The identity of the base model `cfg` loads (cached per process)."""
    return _fingerprint(cfg.path, cfg.tiny_layers, cfg.tiny_hidden, cfg.tiny_heads, cfg.seed)


# --- the adapter dir ---------------------------------------------------------------------------------


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


@dataclass
class Adapter:
    """A loaded adapter: its peft config (dict) and tensors (peft names)."""

    config: dict
    tensors: dict[str, torch.Tensor]

    @property
    def scale(self) -> float:
        return float(self.config["lora_alpha"]) / float(self.config["r"])


def read_adapter(path: str | Path) -> Adapter:
    from safetensors.torch import load_file

    p = Path(path)
    config = json.loads((p / ADAPTER_CONFIG).read_text())
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{p}: peft_type {config.get('peft_type')!r}; only LORA adapters are supported")
    if config.get("use_dora") or config.get("use_rslora") or config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ValueError(f"{p}: DoRA, rsLoRA and per-module rank/alpha patterns are not supported")
    return Adapter(config, load_file(str(p / ADAPTER_WEIGHTS)))


def merged_weights(adapter: Adapter) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(deltas, replacements) in the base model's parameter names: W += scale * B @ A for each adapted
    linear (`deltas`, float32), and the full weights of modules_to_save (`replacements`)."""
    deltas: dict[str, torch.Tensor] = {}
    replacements: dict[str, torch.Tensor] = {}
    t = adapter.tensors
    for k, v in t.items():
        name = k[len(PEFT_PREFIX):] if k.startswith(PEFT_PREFIX) else k
        if name.endswith(".lora_A.weight"):
            module = name[: -len(".lora_A.weight")]
            b = t.get(f"{PEFT_PREFIX}{module}.lora_B.weight", t.get(f"{module}.lora_B.weight"))
            if b is None:
                raise ValueError(f"adapter: {k} has no lora_B partner")
            deltas[f"{module}.weight"] = adapter.scale * (b.float() @ v.float())
        elif name.endswith(".lora_B.weight"):
            continue
        else:
            replacements[name] = v
    return deltas, replacements


def check_base(manifest: dict, served: BaseModel) -> None:
    """Raise BaseMismatch when the manifest's adapter was trained on another base than `served`."""
    a = manifest.get("adapter") or {}
    if a.get("base_sha256") != served.sha256:
        raise BaseMismatch(
            f"weight version {manifest.get('version')} of run {manifest.get('run')!r} is a LoRA adapter on base "
            f"{a.get('base_model')!r} (sha256 {str(a.get('base_sha256'))[:12]}...), but this worker serves "
            f"{served.id!r} (sha256 {served.sha256[:12]}...): set model.* to the trainer's base model")


def check_version_base(path: str | Path, model_cfg: ModelConfig) -> None:
    """For a fetched version dir: when its manifest says `kind: lora`, raise BaseMismatch unless
    `model_cfg` is the adapter's base. Full versions (and dirs without a manifest) pass."""
    mf = Path(path) / "manifest.json"
    if not mf.is_file():
        return
    manifest = json.loads(mf.read_bytes())
    if manifest.get("kind") == "lora":
        check_base(manifest, base_fingerprint(model_cfg))


def merge_into(model, adapter_dir: str | Path) -> None:
    """Merge the adapter in `adapter_dir` into `model`'s weights, in place (W += alpha/r B A;
    modules_to_save replaced). Checks every name and shape before changing anything."""
    deltas, replace = merged_weights(read_adapter(adapter_dir))
    own = model.state_dict()
    new = {**deltas, **replace}
    bad = sorted(k for k in new if k not in own or tuple(own[k].shape) != tuple(new[k].shape))
    if bad:
        raise ValueError(f"LoRA adapter {adapter_dir}: does not fit the model (unknown or wrong-shape tensors {bad[:5]})")
    with torch.no_grad():
        for k, d in deltas.items():
            own[k].copy_((own[k].float() + d).to(own[k].dtype))
        for k, v in replace.items():
            own[k].copy_(v.to(own[k].dtype))
