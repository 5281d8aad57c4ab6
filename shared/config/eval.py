"""Held-out evaluation of policy versions (`jetrl eval`, and the eval process `jetrl up` starts).

docs/launch.md ("jetrl eval") explains the numbers: mean reward over every sample, and pass@k (unbiased estimator).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from shared.config.base import Section


class EvalConfig(Section):
    dataset: str = Field(
        "", description="Held-out JSONL file: one row per prompt with prompt (or messages) and reference "
        "('' = no evaluation during a run)."
    )
    eval_every: int = Field(
        0, ge=0, description="During a run, evaluate the newest version each time the trainer has published "
        "this many versions since the last evaluation (version 0 is always evaluated; 0 = off)."
    )
    samples: int = Field(1, ge=1, le=1024, description="Samples per prompt (the k of pass@k).")
    greedy: bool = Field(
        True, description="Greedy decoding (only with samples = 1); false = sample at `temperature`."
    )
    temperature: float = Field(1.0, ge=0, description="Sampling temperature when not greedy.")
    max_new_tokens: int = Field(0, ge=0, description="Generated tokens per answer (0 = rollout.sampling.max_new_tokens).")
    limit: int = Field(0, ge=0, description="Evaluate only the first N rows (0 = all).")
    success_reward: float = Field(
        1.0, description="A sample with reward >= this counts as solved for pass@k."
    )
    concurrency: int = Field(64, ge=1, description="Prompts generated and scored at once.")
    prompt_field: str = Field("", description="Row field with the prompt ('' = prompt, question, problem or input).")
    reference_field: str = Field(
        "", description="Row field with the reference ('' = reference, answer, solution or target)."
    )
    seed: int = Field(0, description="Sampling seed of the first sample (sample i uses seed + i).")

    @model_validator(mode="after")
    def _check_greedy(self) -> EvalConfig:
        if self.greedy and self.samples > 1:
            raise ValueError("eval.greedy: greedy decoding gives the same answer k times; set greedy: false "
                             f"for samples = {self.samples}, or samples: 1")
        return self
