"""The trainer's optimizer, `trainer.optim.name`:

- `adamw`: torch.optim.AdamW, float32 moments (8 bytes per trainable parameter).
- `adamw_8bit`: bitsandbytes' AdamW8bit, block-wise 8-bit moments (2 bytes per parameter; tensors under
  4,096 elements keep 32-bit state), the same update rule (Dettmers et al. 2022, "8-bit Optimizers via
  Block-wise Quantization"). For a trainer short of memory: SmolLM2-135M's optimizer state falls from
  1.08 GB to ~0.27 GB. On CPU the step is slower (docs/benchmarks.md, "SmolLM2-135M addition").
  Needs `pip install -e ".[bnb]"`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from shared.config.trainer import OptimConfig


def make_optimizer(params: Iterable[torch.nn.Parameter], o: OptimConfig) -> torch.optim.Optimizer:
    kw = dict(lr=o.lr, betas=o.betas, eps=o.adam_eps, weight_decay=o.weight_decay)
    if o.name == "adamw_8bit":
        try:
            import bitsandbytes as bnb
        except ImportError as exc:
            raise RuntimeError("trainer.optim.name adamw_8bit needs bitsandbytes: pip install -e \".[bnb]\"") from exc
        return bnb.optim.AdamW8bit(list(params), **kw)
    return torch.optim.AdamW(list(params), **kw)
