"""Activation checkpointing chosen by size (`trainer.activation_checkpointing: auto`, the default).

A micro-batch's backward needs what its forward saved: for a Llama-style decoder layer in float32 at most
about 10 x hidden + 4 x intermediate + 2 x (key/value heads x head size) floats per token (measured with
autograd's saved-tensor hooks: SmolLM2-135M saves 11,219 per token per layer against this estimate's 12,288;
the tiny test model 990 against 1,024), so SmolLM2's 30 layers hold ~1.35 MB per token and one 4,096-token
micro-batch of long agent samples ~5.5 GB, before any copy the allocator keeps.
With checkpointing a layer keeps only its inputs (~hidden floats per token: 77 KB per token for SmolLM2)
and recomputes the rest in backward, one layer at a time.

`auto` checkpoints exactly the micro-batches whose estimated saved activations are over
`trainer.activation_memory_gb`: short ones (the addition task's ~450-token micro-batches) run as fast as
ever, long ones stay within the budget. Recomputation gives the same values, so the loss and gradients do
not depend on the choice (tests/trainer/test_trainer_activation_budget.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

FLOAT_BYTES = 4  # the estimate is float32's (CPU training); bf16 autocast saves less


def saved_bytes_per_token(hf_config) -> int:
    """Estimated bytes one token's forward saves for backward over all decoder layers (no checkpointing)."""
    hidden = int(hf_config.hidden_size)
    inter = int(getattr(hf_config, "intermediate_size", None) or 4 * hidden)
    heads = int(getattr(hf_config, "num_attention_heads", None) or 1)
    head_dim = int(getattr(hf_config, "head_dim", None) or hidden // heads)
    kv = int(getattr(hf_config, "num_key_value_heads", None) or heads) * head_dim
    return int(hf_config.num_hidden_layers) * (10 * hidden + 4 * inter + 2 * kv) * FLOAT_BYTES


def checkpointed_bytes_per_token(hf_config) -> int:
    """Estimated bytes per token a checkpointed forward keeps: each layer's inputs (hidden state, rotary
    cos/sin) and as much again for the embedding and the final norm (measured: SmolLM2-135M 77 KB against
    this 90 KB)."""
    hidden = int(hf_config.hidden_size)
    head_dim = int(getattr(hf_config, "head_dim", None) or hidden // int(getattr(hf_config, "num_attention_heads", 1)))
    return (int(hf_config.num_hidden_layers) + 2) * (hidden + 2 * head_dim) * FLOAT_BYTES


def wants_checkpointing(setting: bool | str, tokens: int, per_token: int, budget_gb: float) -> bool:
    """Whether a micro-batch of `tokens` runs checkpointed: the setting when it is a bool, else (auto)
    whether its estimated saved activations (tokens x per_token bytes) are over the budget."""
    if isinstance(setting, bool):
        return setting
    return tokens * per_token > budget_gb * 1e9


def checkpointing_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's modules that can checkpoint themselves (transformers' GradientCheckpointingLayer, once
    the model's checkpointing is enabled: they have a checkpoint function set)."""
    return [m for m in model.modules()
            if hasattr(m, "gradient_checkpointing") and getattr(m, "_gradient_checkpointing_func", None) is not None]


@contextlib.contextmanager
def checkpointing(layers: list[torch.nn.Module], on: bool) -> Iterator[None]:
    """Turn the layers' checkpointing on or off for one forward (and the backward of what it saved: the
    choice is read when each layer runs forward), then put it back."""
    before = [m.gradient_checkpointing for m in layers]
    for m in layers:
        m.gradient_checkpointing = on
    try:
        yield
    finally:
        for m, b in zip(layers, before, strict=True):
            m.gradient_checkpointing = b
