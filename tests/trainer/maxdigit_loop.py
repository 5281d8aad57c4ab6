"""The maxdigit task (brief: "max 3 8 1 5 2 =" -> "8") as an in-process sample -> score -> train loop
over the trainer's real algorithm and step code. Used by the learning test."""

from __future__ import annotations

import numpy as np
import torch

from shared.contract.messages import Sample, TrajectoryGroup
from trainer_service.intake import Batch
from trainer_service.service import batch_items
from trainer_service.step import train_step


def make_prompt(rng: np.random.Generator) -> tuple[str, str]:
    digits = rng.integers(0, 10, size=5)
    return "max " + " ".join(str(d) for d in digits) + " =", str(int(digits.max()))


def score(completion: str, reference: str) -> float:
    return 1.0 if completion.lstrip().startswith(reference) else 0.0


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], n: int, new_tokens: int, gen: torch.Generator):
    """n samples per prompt (all prompts have the same length): tokens, per-token logprobs, texts."""
    ids = torch.tensor([tokenizer.encode(p) for p in prompts for _ in range(n)])
    model.eval()
    logps = []
    for _ in range(new_tokens):
        logits = model(input_ids=ids, use_cache=False).logits[:, -1].float()
        lp = torch.log_softmax(logits, -1)
        nxt = torch.multinomial(lp.exp(), 1, generator=gen)
        logps.append(lp.gather(-1, nxt))
        ids = torch.cat([ids, nxt], dim=1)
    return ids, torch.cat(logps, dim=1)


def reference_nll(model, tokenizer, prompts, refs) -> float:
    """Mean -log p(reference digit | prompt): the supervised view of how well the policy solves the task."""
    ids = torch.tensor([tokenizer.encode(p) for p in prompts])
    tgt = torch.tensor([tokenizer.encode(r)[0] for r in refs])
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[:, -1].float(), -1)
    return float(-lp.gather(-1, tgt[:, None]).mean())


def rl_step(backend, cfg, prompts, refs, version: int, gen: torch.Generator, group_size: int = 8,
            new_tokens: int = 1) -> dict:
    tok = backend.tokenizer
    ids, logps = sample(backend.model, tok, prompts, group_size, new_tokens, gen)
    plen = ids.shape[1] - new_tokens
    groups = []
    for i, r in enumerate(refs):
        samples = []
        for j in range(group_size):
            row = ids[i * group_size + j].numpy().astype(np.int32)
            text = tok.decode(row[plen:].tolist())
            mask = np.array([0] * plen + [1] * new_tokens, np.uint8)
            lp = np.concatenate([np.zeros(plen, np.float32), logps[i * group_size + j].numpy().astype(np.float32)])
            samples.append(Sample(tokens=row, loss_mask=mask, logprobs=lp,
                                  versions=np.where(mask == 1, version, -1).astype(np.int32), prompt_len=plen,
                                  reward=score(text, r)))
        groups.append(TrajectoryGroup(run="md", prompt_id=f"q{i}", epoch=version, samples=samples))
    batch = Batch(groups=groups, fresh=[g.samples for g in groups])
    stats = train_step(backend, batch_items(batch, cfg), cfg.trainer, norm_length=new_tokens)
    stats["reward_mean"] = float(np.mean([s.reward for g in groups for s in g.samples]))
    return stats
