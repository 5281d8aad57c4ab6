"""The evaluator: generate and score held-out prompts with one engine and one reward client (the NATS
RewardClient or the in-process LocalRewardClient: same `score`), swapping versions in from the weight
store (version 0 = the engine's initial weights, which are the trainer's version 0). A LoRA version is
applied on the engine's base model (`model.*`) only when it is the adapter's base (BaseMismatch otherwise).
With `rollout.workflow: agent` each row is run as agent episodes through an endpoint this process serves
(evaluation/agent.py; `start()` before and `close()` after evaluating)."""

from __future__ import annotations

import asyncio
import time

from rollout_service.engines.base import Engine, GenerateRequest, SamplingParams
from rollout_service.evaluation.passk import EvalResult, summarise
from rollout_service.workflows.base import WorkflowContext
from shared.config import JetrlConfig
from shared.config.eval import EvalConfig
from shared.model.adapters import check_version_base


class Evaluator:
    """Generate and score held-out prompts with one engine; swap versions in with `load`."""

    def __init__(self, cfg: JetrlConfig, ecfg: EvalConfig, engine: Engine, tokenizer, reward, weights=None):
        self.cfg, self.ecfg = cfg, ecfg
        self.engine, self.reward, self.weights = engine, reward, weights
        self.ctx = WorkflowContext(engine=engine, tokenizer=tokenizer, reward=reward, tools=None, cfg=cfg)
        self.agent = None
        if cfg.rollout.workflow == "agent":
            from rollout_service.evaluation.agent import AgentEpisodes

            self.agent = AgentEpisodes(cfg, ecfg, engine, tokenizer, reward)

    async def start(self, nc=None) -> None:
        """Serve the agent endpoint (agent workflows only; `nc` for agent services)."""
        if self.agent is not None:
            await self.agent.start(nc)

    async def close(self) -> None:
        if self.agent is not None:
            await self.agent.close()

    def sampling(self, index: int) -> SamplingParams:
        s = self.cfg.rollout.sampling
        greedy = self.ecfg.greedy
        return SamplingParams(
            temperature=0.0 if greedy else self.ecfg.temperature,
            top_p=1.0 if greedy else s.top_p,
            top_k=0 if greedy else s.top_k,
            max_new_tokens=self.ecfg.max_new_tokens or s.max_new_tokens,
            stop=list(s.stop), stop_token_ids=list(s.stop_token_ids),
            seed=None if greedy else self.ecfg.seed + index,
            allowed_token_ids=list(s.allowed_token_ids),  # the policy is evaluated as it samples
        )

    async def load(self, version: int) -> None:
        """Put `version` into the engine (fetched from the weight store unless it is already there)."""
        if version == self.engine.version:
            return
        if self.weights is None:
            raise ValueError(f"version {version}: no weight store client to fetch it with")
        path = await self.weights.fetch(self.cfg.run, version)
        await asyncio.to_thread(check_version_base, path, self.cfg.model)
        await self.engine.update_weights(version, path=str(path))

    async def _one(self, payload: dict, sem: asyncio.Semaphore, index: int) -> tuple[list[float], int, list[str]]:
        async with sem:
            if self.agent is not None:
                return await self.agent.one(payload, index)
            prompt = self.ctx.render_prompt(payload)
            outs = await asyncio.gather(*(self.engine.generate(GenerateRequest(prompt_ids=prompt, sampling=self.sampling(i)))
                                          for i in range(self.ecfg.samples)))
            texts = [self.ctx.decode(o.output_ids) for o in outs]
            rr = await self.reward.score(self.cfg.reward.task, texts, payload.get("reference"), payload=payload,
                                         completion_ids=[o.output_ids for o in outs])
            if rr.error:
                raise RuntimeError(f"reward task {self.cfg.reward.task!r}: {rr.error}")
            errors = sum(1 for e in (rr.errors or []) if e)
            return [float(x) for x in rr.rewards], errors, texts

    async def evaluate(self, rows: list[dict], dataset: str = "") -> EvalResult:
        version = self.engine.version
        t0 = time.monotonic()
        sem = asyncio.Semaphore(self.ecfg.concurrency)
        if self.agent is not None:
            self.agent.reset()
        results = await asyncio.gather(*(self._one(r, sem, i) for i, r in enumerate(rows)))
        if self.engine.version != version:
            raise RuntimeError(f"the engine changed version during evaluation ({version} -> {self.engine.version})")
        result = summarise(version, [r for r, _, _ in results], self.ecfg.success_reward,
                           errors=sum(e for _, e, _ in results), dataset=dataset, seconds=time.monotonic() - t0)
        result.completions = [t for _, _, t in results]
        if self.agent is not None and (use := self.agent.tool_use()) is not None:
            result.tool_call_rate, result.calls_per_episode, result.tool_calls_per_episode = use
        return result
