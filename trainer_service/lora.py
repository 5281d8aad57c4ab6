"""LoRA on the trainer's policy with `peft`: wrap the HF model, take the adapter out of a state dict,
write an adapter version (a PEFT adapter dir, shared/model/adapters.py) and describe it for the manifest."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from shared.config import JetrlConfig, ModelConfig
from shared.config.trainer import LoraConfig
from shared.model.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, base_fingerprint


def peft_config(lc: LoraConfig):
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(r=lc.rank, lora_alpha=lc.alpha, lora_dropout=lc.dropout,
                          target_modules=list(lc.target_modules), modules_to_save=list(lc.modules_to_save) or None,
                          bias="none")


def wrap(model, lc: LoraConfig):
    """The peft model: base frozen, adapters (B = 0: the policy starts as the base) and modules_to_save
    trainable. Raises naming trainer.lora.target_modules when none of them matches a module."""
    from peft import get_peft_model

    try:
        return get_peft_model(model, peft_config(lc))
    except ValueError as exc:
        raise ValueError(f"trainer.lora.target_modules {lc.target_modules}: {exc}") from None


def unwrap(model):
    """The HF model inside a peft model (the model itself otherwise)."""
    from peft import PeftModel

    return model.get_base_model() if isinstance(model, PeftModel) else model


def adapter_state_dict(model, full: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The adapter's tensors in peft's saved names (what adapter_model.safetensors holds)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model, state_dict=full)


def adapter_info(cfg: JetrlConfig) -> dict:
    """The manifest's `adapter` object of this run's versions."""
    lc = cfg.trainer.lora
    base = base_fingerprint(cfg.model)
    return {"base_model": base.id, "base_sha256": base.sha256, "rank": lc.rank, "alpha": lc.alpha,
            "target_modules": sorted(lc.target_modules), "modules_to_save": sorted(lc.modules_to_save)}


def write_adapter_dir(out: Path, tensors: dict[str, torch.Tensor], lc: LoraConfig, model_cfg: ModelConfig) -> Path:
    """A PEFT adapter dir: adapter_config.json + adapter_model.safetensors (nothing of the base)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    pc = peft_config(lc).to_dict()
    pc["base_model_name_or_path"] = model_cfg.path or None
    pc["inference_mode"] = True
    pc["target_modules"] = sorted(pc["target_modules"])
    (out / ADAPTER_CONFIG).write_text(json.dumps(pc, indent=1, sort_keys=True, default=list))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    return out
