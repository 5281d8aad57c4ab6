"""Token sampling and stop conditions, as pure functions on one sequence's logits.

One row at a time, with that request's own torch.Generator: a request's draws then depend only on its
seed and its logits, never on which other requests share the batch.
"""

from __future__ import annotations

from typing import Any

import torch

from rollout_service.engines.base import SamplingParams


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A per-request generator; seed None draws a fresh random seed."""
    g = torch.Generator(device=device)
    if seed is None:
        g.seed()
    else:
        g.manual_seed(int(seed))
    return g


def sample_rows(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> torch.Tensor:
    """One token id per row of `logits` [B, V] under each row's own sampling params and generator.

    Temperature 0 rows take the argmax. The others: divide by the temperature, sort, keep the top-k
    ranks (top_k 0 = all) and the smallest prefix whose mass reaches top_p (the most likely token always
    stays), renormalise, and invert the CDF at one uniform draw from the row's generator. All the maths
    is row-wise, so a row's token does not depend on which other rows share the batch.
    """
    n_rows, vocab = logits.shape
    tokens = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if p.temperature > 0]
    if not rows:
        return tokens
    dev = logits.device
    sub = [params[i] for i in rows]
    temp = torch.tensor([p.temperature for p in sub], dtype=torch.float32, device=dev)
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in sub], device=dev)
    top_p = torch.tensor([p.top_p if p.top_p < 1.0 else float("inf") for p in sub], device=dev)
    x = logits[rows].float() / temp[:, None]
    sorted_x, order = torch.sort(x, dim=-1, descending=True)
    probs = torch.softmax(sorted_x, dim=-1)
    ranks = torch.arange(vocab, device=dev)
    keep = (ranks[None, :] < top_k[:, None]) & ((probs.cumsum(dim=-1) - probs) < top_p[:, None])
    cdf = (probs * keep).cumsum(dim=-1)
    u = torch.stack([torch.rand((), generator=generators[i], device=dev) for i in rows])
    pick = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).clamp(max=vocab - 1)
    pick = torch.minimum(pick, keep.sum(dim=-1, keepdim=True) - 1)  # never past the kept prefix
    tokens[rows] = order.gather(1, pick)[:, 0]
    return tokens


class StopChecker:
    """Decides after each new token whether a sequence is done: EOS / stop token ids, stop strings, length.

    Stop strings are matched on the decoded text of the last few tokens only (enough to hold the
    longest stop string), so the cost per token does not grow with the output.
    """

    def __init__(self, p: SamplingParams, eos_token_id: int | None, tokenizer: Any | None):
        self.max_new = p.max_new_tokens
        self.stop_ids = set(p.stop_token_ids)
        if eos_token_id is not None and not p.ignore_eos:
            self.stop_ids.add(int(eos_token_id))
        self.stop = list(p.stop)
        if self.stop and tokenizer is None:
            raise ValueError("sampling.stop: stop strings need a tokenizer (this engine has none)")
        self.tokenizer = tokenizer
        self.window = max((len(s) for s in self.stop), default=0) + 2

    def finish_reason(self, output_ids: list[int]) -> str | None:
        """None while the sequence goes on; else "stop" or "length"."""
        if output_ids and output_ids[-1] in self.stop_ids:
            return "stop"
        if self.stop:
            tail = self.tokenizer.decode(output_ids[-self.window :], skip_special_tokens=False)
            if any(s in tail for s in self.stop):
                return "stop"
        if len(output_ids) >= self.max_new:
            return "length"
        return None
