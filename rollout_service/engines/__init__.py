"""Inference engines behind one interface (base.py); `make_engine` picks one from the run config.

local   torch + transformers in this process, continuous batching   (local.py)
vllm    client of a vLLM OpenAI-compatible server                    (vllm.py)
sglang  client of an SGLang server's native API                      (sglang.py)
sim     latency model of a GPU server, for orchestration benchmarks  (sim.py)
"""

from __future__ import annotations

from rollout_service.engines.base import Engine, GenerateRequest, GenerateResult, SamplingParams
from shared.config import JetrlConfig

ENGINES = ("local", "vllm", "sglang", "sim")


def make_engine(cfg: JetrlConfig) -> Engine:
    """The engine `cfg.rollout.engine` names, configured from `cfg.rollout.<engine>` (not started yet)."""
    name = cfg.rollout.engine
    if name == "local":
        from rollout_service.engines.local import LocalEngine

        return LocalEngine(cfg)
    if name == "vllm":
        from rollout_service.engines.vllm import VllmEngine

        return VllmEngine(cfg)
    if name == "sglang":
        from rollout_service.engines.sglang import SglangEngine

        return SglangEngine(cfg)
    if name == "sim":
        from rollout_service.engines.sim import SimEngine

        return SimEngine(cfg)
    raise ValueError(f"rollout.engine: unknown engine {name!r} (known: {', '.join(ENGINES)})")


__all__ = ["ENGINES", "Engine", "GenerateRequest", "GenerateResult", "SamplingParams", "make_engine"]
