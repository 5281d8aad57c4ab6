"""The judge scorer: a group of completions in, one Score per completion out.

pointwise  each completion is judged on each rubric criterion (or on `instructions`, named 'overall') with
           the pointwise template and parser; its reward is the weighted mean of the criterion scores, and
           every criterion's score is in its metrics as `criterion/<name>`; an empty (or blank) completion
           scores 0 on every criterion without a judge call
pairwise   the group's completions are compared in pairs (pairwise.py) with the pairwise template; the
           reward is the win rate, in metrics as `pairwise/win_rate` with `pairwise/comparisons`; identical
           completions tie and an empty one loses, without a judge call

Every judge call of every concurrent request goes to the backend at once, up to `max_concurrency`, so the
engine batches them. Identical questions (same criterion, prompt, reference and completion, or the same
ordered pair; a Judge's template, parser and scale never change) are asked once: an LRU of answers, and a
second asker awaits the first's call. A judgement the parser refuses is asked again `parse_retries` times; then `on_unparseable` decides. A backend that
gives no answer (JudgeUnavailable) fails the whole group (JudgeFailed): the rollout worker retries it and
the stream dead-letters it with the reason; no made-up reward is ever given.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from reward_service.judge import pairwise, parse, template
from reward_service.judge.backends import Backend, JudgeUnavailable, make_backend
from reward_service.scorers import GroupFailed, Score
from shared.config.reward import JudgeConfig

log = logging.getLogger("jetrl.reward.judge")


class JudgeFailed(GroupFailed):
    """The group cannot be judged: the request is answered with this as its `error`."""


class Judge:
    """`await start()`, then `await score_group(completions, reference, payload)`; `await close()`."""

    def __init__(self, cfg: JudgeConfig, backend: Backend | None = None):
        self.cfg = cfg
        self.criteria = ([(c.name, c.description, c.weight) for c in cfg.rubric]
                         or [("overall", cfg.instructions, 1.0)])
        self.template = cfg.template or template.BUILTIN[cfg.parser]
        self.pair_template = cfg.pairwise_template or template.PAIRWISE
        if cfg.mode == "pointwise":
            template.check_template(self.template, template.POINTWISE_FIELDS, ("completion",),
                                    "reward.judge.template")
        else:
            template.check_template(self.pair_template, template.PAIRWISE_FIELDS, ("completion_a", "completion_b"),
                                    "reward.judge.pairwise_template")
        if cfg.follow_policy and cfg.backend == "openai":
            raise ValueError("reward.judge.follow_policy: only a judge on jetrl's own engine (backend local or "
                             "vllm) can load the policy's versions")
        self.backend = backend or make_backend(cfg)
        self._sem = asyncio.Semaphore(cfg.max_concurrency)
        self._cache: OrderedDict[str, asyncio.Future] = OrderedDict()
        self.stats = {"calls": 0, "cache_hits": 0, "unparseable": 0, "retries": 0, "unavailable": 0,
                      "policy_version": -1}

    async def start(self) -> None:
        await self.backend.start()
        log.info("judge on %s (%s, %s, parser %s, %d criteria)", self.backend.name, self.cfg.model or "tiny",
                 self.cfg.mode, self.cfg.parser, len(self.criteria))

    async def close(self) -> None:
        await self.backend.close()

    def swapped(self, version: int) -> None:
        """follow_policy loaded a policy version: answers given by the older weights are forgotten."""
        self._cache.clear()
        self.stats["policy_version"] = version

    # --- one question, asked once ---------------------------------------------------------------

    async def _cached(self, key: str, compute: Callable[[], Awaitable[float]]) -> float:
        """compute() once per key (concurrent askers share the call); failures are not remembered."""
        if self.cfg.cache_size:
            fut = self._cache.get(key)
            if fut is not None:
                self._cache.move_to_end(key)
                self.stats["cache_hits"] += 1
                return await asyncio.shield(fut)
            fut = asyncio.get_running_loop().create_future()
            self._cache[key] = fut
            while len(self._cache) > self.cfg.cache_size:
                self._cache.popitem(last=False)
        try:
            value = await compute()
        except BaseException as exc:
            if self.cfg.cache_size:
                self._cache.pop(key, None)
                if not fut.done():
                    fut.set_exception(exc if isinstance(exc, Exception) else JudgeUnavailable("cancelled"))
                    fut.exception()  # retrieved: no "never retrieved" warning when nobody else waits
            raise
        if self.cfg.cache_size and not fut.done():
            fut.set_result(value)
        return value

    async def _ask(self, text: str, parse_reply: Callable[[Any], float], yes_no: bool) -> float:
        """One judgement: ask, parse, ask again on an unparseable answer (parse_retries times)."""
        messages = [{"role": "user", "content": text}]
        temperature = self.cfg.temperature
        for attempt in range(self.cfg.parse_retries + 1):
            async with self._sem:
                self.stats["calls"] += 1
                try:
                    reply = await self.backend.ask(messages, max_tokens=self.cfg.max_new_tokens,
                                                   temperature=temperature, yes_no=yes_no)
                except JudgeUnavailable:
                    self.stats["unavailable"] += 1
                    raise
            try:
                return parse_reply(reply)
            except parse.Unparseable:
                if attempt == self.cfg.parse_retries:
                    self.stats["unparseable"] += 1
                    raise
                self.stats["retries"] += 1
                temperature = max(temperature, 0.7)  # a greedy judge would only repeat itself
        raise AssertionError("unreachable")

    def _parser(self) -> Callable[[Any], float]:
        c = self.cfg
        if c.parser == "score_line":
            return lambda r: parse.score_line(r.text, c.scale)
        if c.parser == "json":
            return lambda r: parse.json_field(r.text, c.json_field, c.scale)
        return lambda r: parse.yes_no(r.top)

    @staticmethod
    def _key(*parts: Any) -> str:
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()

    # --- a group --------------------------------------------------------------------------------

    async def score_group(self, completions: list[str], reference: Any, payload: dict) -> list[Score]:
        prompt = template.prompt_text(payload if isinstance(payload, dict) else {})
        ref = template.reference_text(reference)
        shown = [template.clip(c, self.cfg.max_completion_chars) for c in completions]
        try:
            if self.cfg.mode == "pairwise":
                return await self._pairwise(shown, prompt, ref)
            return await self._pointwise(shown, prompt, ref)
        except JudgeUnavailable as exc:
            raise JudgeFailed(str(exc)) from None

    async def _pointwise(self, shown: list[str], prompt: str, ref: str) -> list[Score]:
        c, parse_reply = self.cfg, self._parser()
        yes_no = c.parser == "yes_no"

        async def one(completion: str, name: str, description: str) -> float:
            text = template.render(self.template, {
                "prompt": prompt, "reference": ref, "completion": completion, "criterion": name,
                "description": description, "scale": f"{c.scale:g}", "fence": template.fence()})
            key = self._key("point", name, description, prompt, ref, completion)
            return await self._cached(key, lambda: self._ask(text, parse_reply, yes_no))

        async def empty() -> float:
            return 0.0

        jobs = [one(s, name, desc) if s.strip() else empty() for s in shown for name, desc, _ in self.criteria]
        results = await asyncio.gather(*jobs, return_exceptions=True)
        self._raise_unavailable(results)
        k = len(self.criteria)
        total_w = sum(w for _, _, w in self.criteria)
        scores: list[Score] = []
        for i in range(len(shown)):
            row = results[i * k:(i + 1) * k]
            metrics = {f"criterion/{name}": v for (name, _, _), v in zip(self.criteria, row, strict=True)
                       if not isinstance(v, BaseException)}
            bad = [(name, v) for (name, _, _), v in zip(self.criteria, row, strict=True)
                   if isinstance(v, BaseException)]
            if bad:
                scores.append(Score(0.0, metrics, "; ".join(f"criterion {n}: {e}" for n, e in bad)))
            else:
                scores.append(Score(sum(w * v for (_, _, w), v in zip(self.criteria, row, strict=True)) / total_w,
                                    metrics))
        return self._settle(scores)

    async def _pairwise(self, shown: list[str], prompt: str, ref: str) -> list[Score]:
        c = self.cfg
        description = "; ".join(f"{name}: {desc}" if len(self.criteria) > 1 else desc
                                for name, desc, _ in self.criteria)
        order = pairwise.schedule(len(shown), c.pairwise.max_opponents, c.pairwise.both_orders)

        async def one(a: int, b: int) -> float:
            if shown[a] == shown[b] or not (shown[a].strip() and shown[b].strip()):
                # the same text ties; an empty answer loses to any other: neither needs the judge
                return 0.5 if shown[a].strip() == shown[b].strip() else float(bool(shown[a].strip()))
            text = template.render(self.pair_template, {
                "prompt": prompt, "reference": ref, "completion_a": shown[a], "completion_b": shown[b],
                "description": description, "fence_a": template.fence(), "fence_b": template.fence()})
            key = self._key("pair", prompt, ref, shown[a], shown[b])
            return await self._cached(key, lambda: self._ask(text, lambda r: parse.choice(r.text), False))

        results = await asyncio.gather(*(one(a, b) for a, b in order), return_exceptions=True)
        self._raise_unavailable(results)
        failed: dict[int, list[str]] = {}
        verdicts = {}
        for (a, b), v in zip(order, results, strict=True):
            if isinstance(v, BaseException):
                for i in (a, b):
                    failed.setdefault(i, []).append(f"pair ({a}, {b}): {v}")
            else:
                verdicts[(a, b)] = v
        rates, seen = pairwise.win_rates(len(shown), verdicts)
        scores = [Score(0.0, {}, "; ".join(failed[i])) if i in failed else
                  Score(rates[i], {"pairwise/win_rate": rates[i], "pairwise/comparisons": seen[i]})
                  for i in range(len(shown))]
        return self._settle(scores)

    @staticmethod
    def _raise_unavailable(results: list) -> None:
        for r in results:
            if isinstance(r, JudgeUnavailable):
                raise r
            if isinstance(r, BaseException) and not isinstance(r, (parse.Unparseable, ValueError)):
                raise JudgeUnavailable(f"judging failed: {type(r).__name__}: {r}")

    def _settle(self, scores: list[Score]) -> list[Score]:
        """on_unparseable: fail the group, or keep the per-completion errors (reward 0, errors[i] set)."""
        bad = [i for i, s in enumerate(scores) if s.error]
        if bad and self.cfg.on_unparseable == "fail_group":
            raise JudgeFailed(f"the judge's answer for completion(s) {bad} could not be used: {scores[bad[0]].error}")
        return scores
