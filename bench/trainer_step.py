"""Tokens/s of the trainer's optimizer step (packing, proximal pass, decoupled PPO loss, backward,
AdamW) on a ~25M-parameter Qwen2 against a plain single-process PyTorch loop with padded batches on
the same samples (forward, policy-gradient loss, backward, AdamW). Lengths are long-tailed
(lognormal), as RL completions are, which is where padding costs.

    python bench/trainer_step.py [--samples 48] [--hidden 512] [--layers 8] [--budget 2048] [--pad-batch 8]

Throughput counts real (non-padding) tokens for both. Last line: `trainer_throughput_ratio: X`.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from shared.config import JetrlConfig, load_config
from shared.model.tinymodel import build_tiny_model
from trainer_service.backends.fsdp import FSDPBackend
from trainer_service.packing import TrainItem
from trainer_service.step import train_step


def make_items(n: int, vocab: int, seed: int, max_len: int) -> list[TrainItem]:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(mean=4.3, sigma=0.8, size=n).astype(int) + 24, 24, max_len)
    items = []
    for k, L in enumerate(lengths):
        p = 16
        mask = np.array([0] * p + [1] * (L - p), np.uint8)
        items.append(TrainItem(tokens=rng.integers(4, vocab, size=L).astype(np.int32), loss_mask=mask,
                               behav_logp=np.where(mask == 1, -4.0, 0.0).astype(np.float32),
                               advantage=float(rng.normal()), group_id=str(k)))
    return items


def padded_step(model, opt, items: list[TrainItem], batch: int) -> None:
    """The plain loop: batches in arrival order, right-padded to the longest, attention_mask for pads."""
    opt.zero_grad(set_to_none=True)
    n_loss = sum(it.num_loss_tokens for it in items)
    for s in range(0, len(items), batch):
        chunk = items[s:s + batch]
        T = max(it.length for it in chunk)
        ids = torch.zeros(len(chunk), T, dtype=torch.long)
        att = torch.zeros(len(chunk), T, dtype=torch.long)
        mask = torch.zeros(len(chunk), T)
        adv = torch.zeros(len(chunk), 1)
        for i, it in enumerate(chunk):
            ids[i, :it.length] = torch.from_numpy(it.tokens.astype(np.int64))
            att[i, :it.length] = 1
            mask[i, :it.length] = torch.from_numpy(it.loss_mask.astype(np.float32))
            adv[i] = it.advantage
        logits = model(input_ids=ids, attention_mask=att, use_cache=False).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss = -(adv * logp * mask[:, 1:]).sum() / n_loss
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=48)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--budget", type=int, default=2048, help="trainer.micro_batch_tokens")
    ap.add_argument("--pad-batch", type=int, default=8, help="samples per padded batch of the baseline")
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per side (after one warm-up)")
    a = ap.parse_args()
    torch.manual_seed(0)
    cfg = load_config(JetrlConfig, None, [f"model.tiny_hidden={a.hidden}", f"model.tiny_layers={a.layers}",
                                          f"model.tiny_heads={a.heads}", f"trainer.micro_batch_tokens={a.budget}",
                                          "trainer.device=cpu", "trainer.optim.lr=1e-5"])
    backend = FSDPBackend(cfg)
    n_params = sum(p.numel() for p in backend.model.parameters())
    vocab = backend.model.config.vocab_size
    batches = [make_items(a.samples, vocab, seed=s, max_len=a.max_len) for s in range(a.steps + 1)]
    real = [sum(it.length for it in b) for b in batches]
    lens = [it.length for it in batches[0]]
    padded_tokens = sum(max(lens[s:s + a.pad_batch]) * len(lens[s:s + a.pad_batch])
                        for s in range(0, len(lens), a.pad_batch))
    print(f"model: {n_params / 1e6:.1f}M params (hidden {a.hidden}, {a.layers} layers), fp32 CPU, "
          f"{torch.get_num_threads()} threads")
    print(f"samples/step: {a.samples}, lengths min {min(lens)} median {int(np.median(lens))} max {max(lens)}; "
          f"padding would make {padded_tokens} tokens of {sum(lens)} ({padded_tokens / sum(lens):.2f}x)")

    def timed(fn) -> float:
        fn(batches[0])  # warm-up
        t0 = time.perf_counter()
        for b in batches[1:]:
            fn(b)
        return sum(real[1:]) / (time.perf_counter() - t0)

    trainer_tps = timed(lambda b: train_step(backend, b, cfg.trainer, norm_length=64))
    base = build_tiny_model(cfg.model)[0]  # same init (seeded), transformers' default sdpa attention
    opt = torch.optim.AdamW(base.parameters(), lr=1e-5)
    base.train()
    padded_tps = timed(lambda b: padded_step(base, opt, b, a.pad_batch))
    print(f"trainer step (packed, budget {a.budget}, decoupled PPO incl. proximal pass): {trainer_tps:.0f} tokens/s")
    print(f"plain padded loop (batch {a.pad_batch}, PG loss, no proximal pass): {padded_tps:.0f} tokens/s")
    print(f"trainer_throughput_ratio: {trainer_tps / padded_tps:.2f}")


if __name__ == "__main__":
    main()
