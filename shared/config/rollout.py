"""Rollout workers: workflow, inference engine, concurrency."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from shared.config.base import Section
from shared.config.engines import LocalEngineConfig, SglangEngineConfig, SimEngineConfig, VllmEngineConfig
from shared.config.workflows import (
    AgentConfig,
    MultiTurnConfig,
    OnlineConfig,
    ServiceConfig,
    ToolAgentConfig,
    ToolsConfig,
)


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0, description="0 = greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens (0 = off).")
    max_new_tokens: int = Field(64, ge=1, description="Generated tokens per turn.")
    stop: list[str] = Field(default_factory=list, description="Stop strings.")
    stop_token_ids: list[int] = Field(default_factory=list, description="Extra stop token ids (EOS always stops).")
    seed: int | None = Field(None, description="Sampling seed (None = random).")
    ignore_eos: bool = Field(False, description="Do not stop at EOS (stop_token_ids still stop); for benchmarks.")
    allowed_token_ids: list[int] = Field(
        default_factory=list,
        description="Sample only these token ids ([] = any). The behaviour logprobs are then those of the "
        "softmax over the allowed ids, and the trainer applies the same logits mask to generated tokens "
        "(shared/model/logits_mask.py). Honoured by the local and vllm engines; sglang refuses it. EOS stops a "
        "sequence only if it is allowed.",
    )


class AdaptiveConfig(Section):
    """Adaptive sampling (rollout_service/adaptive.py; docs/algorithms.md, "Adaptive sampling"): a prompt whose
    group has no reward spread is sampled again, in rounds, until it has one or the budget is spent."""

    max_samples: int = Field(
        0, ge=0,
        description="Samples one prompt may take in all (e.g. 64 with group_size 8: up to 8 rounds). 0 = off: "
        "one round of group_size, as without adaptive sampling. Must be 0 or at least group_size.")
    round_size: int = Field(
        0, ge=0, description="Samples drawn per extra round (0 = group_size). The last round is cut to the budget.")
    stop: Literal["yield", "spread"] = Field(
        "yield",
        description="When a prompt without a spread stops before max_samples. spread = never: it is sampled until "
        "it has a spread or the budget is spent (Reinforce-Ada). yield = also when another round of it is not worth "
        "a fresh prompt: the worker keeps how often each round found a prompt's first spread per draw over its recent "
        "prompts and draws round k only if a Thompson draw of round k's rate is at least one of round 1's (a fresh "
        "prompt's). Where the prompts that fail a round are mostly ones the policy never solves, the draws go to "
        "fresh prompts.")
    yield_window: int = Field(256, ge=1, description="stop=yield: the recent prompts per round whose outcomes "
                              "the rates are estimated from (the rates follow the policy as it learns).")
    weights: Literal["inclusion", "draws", "none"] = Field(
        "draws",
        description="How a group of group_size is formed from more draws. All keep a balanced subset (successes "
        "and failures as even as the draws allow) and take the advantage baseline (mean, std) from every draw. "
        "inclusion = each kept sample also carries the inverse of its chance to be kept (Horvitz-Thompson) times "
        "g/n, so the kept group's gradient is an unbiased estimate of the mean gradient over all n draws, weighing "
        "as g samples; draws = the same without g/n: an unbiased estimate of training on every draw (the full "
        "group with its true mean), weighing as n samples, so a lone success found in many draws keeps its whole "
        "advantage; none = Reinforce-Ada's balanced groups as published (Xiong et al. 2025), weight 1, which "
        "up-weights the rare outcome against the draws' gradient. The default is draws: on the sparse subtraction "
        "task (docs/benchmarks.md) it learned most of the three in 15-minute runs (noisy: +9 and +0 points).")
    success_reward: float = Field(
        1.0, description="A sample counts as a success (solve rates, prompt memory) when its reward is at least "
        "this. The signal rule itself is any reward spread, whatever this threshold.")
    eps: float = Field(1e-6, ge=0, description="Rewards within this of each other count as equal (no spread).")


class RolloutConfig(Section):
    engine: Literal["local", "vllm", "sglang", "sim"] = Field("local", description="Inference engine.")
    workflow: str = Field(
        "single_turn",
        description="single_turn | multi_turn | tool_agent | agent (an agent on the OpenAI-compatible endpoint, "
        "docs/agents.md) | 'package.module:Class' (a user workflow).",
    )
    group_size: int = Field(4, ge=1, description="Samples per prompt (the GRPO group).")
    max_in_flight: int = Field(8, ge=1, description="Prompt tasks one worker runs at once.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    adaptive: AdaptiveConfig = Field(default_factory=AdaptiveConfig,
                                     description="Sample a prompt again while its group has no reward spread.")
    device: str = Field("cpu", description="Local engine: torch device.")
    workflow_args: dict = Field(default_factory=dict, description="Keyword arguments for the workflow class.")
    multi_turn: MultiTurnConfig = Field(default_factory=MultiTurnConfig)
    tool_agent: ToolAgentConfig = Field(default_factory=ToolAgentConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig, description="The OpenAI-compatible endpoint and agents.")
    online: OnlineConfig = Field(default_factory=OnlineConfig, description="`jetrl serve-policy`: sessions from "
                                 "outside traffic, rewarded later.")
    service: ServiceConfig = Field(default_factory=ServiceConfig)
    local: LocalEngineConfig = Field(default_factory=LocalEngineConfig, description="engine=local options.")
    vllm: VllmEngineConfig = Field(default_factory=VllmEngineConfig, description="engine=vllm options.")
    sglang: SglangEngineConfig = Field(default_factory=SglangEngineConfig, description="engine=sglang options.")
    sim: SimEngineConfig = Field(default_factory=SimEngineConfig, description="engine=sim options.")

    @model_validator(mode="after")
    def _check_bounds(self) -> RolloutConfig:
        svc = self.service
        if self.group_size > svc.max_group_size:
            raise ValueError(f"rollout.group_size {self.group_size} is over rollout.service.max_group_size "
                             f"{svc.max_group_size}: raise the bound or lower the group size")
        if self.sampling.max_new_tokens > svc.max_new_tokens:
            raise ValueError(f"rollout.sampling.max_new_tokens {self.sampling.max_new_tokens} is over "
                             f"rollout.service.max_new_tokens {svc.max_new_tokens}")
        ad = self.adaptive
        if ad.max_samples and ad.max_samples < self.group_size:
            raise ValueError(f"rollout.adaptive.max_samples {ad.max_samples} is below rollout.group_size "
                             f"{self.group_size}: use 0 (off) or at least the group size")
        if ad.round_size > svc.max_group_size:
            raise ValueError(f"rollout.adaptive.round_size {ad.round_size} is over rollout.service.max_group_size "
                             f"{svc.max_group_size}")
        return self

    @model_validator(mode="after")
    def _check_allowed_tokens(self) -> RolloutConfig:
        sp = self.sampling
        if not sp.allowed_token_ids:
            return self
        if self.engine == "sglang":
            raise ValueError("rollout.sampling.allowed_token_ids: the sglang engine cannot honour it (SGLang has "
                             "no allowed-token sampling parameter whose logprobs match the trainer's mask); use "
                             "engine local or vllm, or drop the option")
        if self.engine == "vllm" and (sp.temperature != 1.0 or sp.top_p < 1.0 or sp.top_k > 0):
            raise ValueError("rollout.sampling.allowed_token_ids: with engine vllm it needs temperature 1, top_p 1 "
                             "and top_k 0 (vLLM returns the masked logprobs only as processed logprobs, which "
                             "also apply temperature / top-k / top-p; the trainer's do not)")
        return self
