"""Where the judge model runs. A backend answers one chat (a list of messages) with the judge's text, or
with its first-token distribution for yes/no (`ask(..., yes_no=True)`); a failure to get an answer
(time-out, refused connection, HTTP error, engine error) raises JudgeUnavailable, which fails the whole
reward request (the reward protocol's error path: retried by the rollout worker, then dead-lettered).

EngineBackend   jetrl's own engines (rollout_service/engines: `local` torch with continuous batching, or
                `vllm`) in the reward process, on the judge's own fixed weights (`judge.model`)
OpenAIBackend   any OpenAI-compatible chat-completions endpoint, through the official `openai` client
"""

from __future__ import annotations

import abc
import asyncio
import os
from dataclasses import dataclass, field
from typing import Any

from shared.config import JetrlConfig
from shared.config.reward import JudgeConfig


class JudgeUnavailable(RuntimeError):
    """The judge gave no answer (time-out, connection, HTTP or engine error)."""


@dataclass
class Reply:
    text: str = ""
    top: list[tuple[str, float]] = field(default_factory=list)  # yes_no: first token's candidates and logprobs


class Backend(abc.ABC):
    name = "backend"

    async def start(self) -> None:  # noqa: B027 (optional hook)
        pass

    async def close(self) -> None:  # noqa: B027 (optional hook)
        pass

    @abc.abstractmethod
    async def ask(self, messages: list[dict], *, max_tokens: int, temperature: float, yes_no: bool) -> Reply:
        """The judge's answer to one chat (its text, or with yes_no its first-token candidates)."""


def judge_engine_config(cfg: JudgeConfig) -> JetrlConfig:
    """The run config a jetrl engine needs to serve the judge: its model, device and batch, nothing else."""
    return JetrlConfig.model_validate({
        "model": {"path": cfg.model},
        "rollout": {"engine": cfg.backend, "device": cfg.device,
                    "local": {"max_batch": cfg.max_batch, "max_prefill_batch": cfg.max_batch,
                              "torch_threads": cfg.torch_threads},
                    "vllm": {"url": cfg.vllm_url, "request_timeout_s": cfg.request_timeout_s}}})


class EngineBackend(Backend):
    """The judge on a jetrl engine in this process. Concurrent asks are batched by the engine (the local
    engine decodes up to `judge.max_batch` of them together, vLLM batches on its server).

    The local engine is handed at most `max_batch` calls at once, so each one runs as soon as it is handed
    over and `request_timeout_s` times the judging, not a wait in the engine's queue behind other calls."""

    def __init__(self, cfg: JudgeConfig, engine: Any = None, tokenizer: Any = None):
        from rollout_service.engines import make_engine

        self.cfg = cfg
        self.name = cfg.backend
        self.engine = engine if engine is not None else make_engine(judge_engine_config(cfg))
        self.tokenizer = tokenizer
        self._yes_no: list[int] = []
        self._slots = asyncio.Semaphore(cfg.max_batch) if cfg.backend == "local" else None

    async def start(self) -> None:
        await self.engine.start()
        if self.tokenizer is None:
            self.tokenizer = getattr(self.engine, "tokenizer", None)
        if self.tokenizer is None:
            from shared.model.tinymodel import load_tokenizer

            self.tokenizer = await asyncio.to_thread(load_tokenizer, self.cfg.model)
        if self.cfg.parser == "yes_no" and self.cfg.mode == "pointwise":
            self._yes_no = yes_no_ids(self.tokenizer)
            if self.engine.max_top_logprobs < len(self._yes_no):
                raise ValueError(f"reward.judge.parser yes_no: the {self.engine.name} engine returns "
                                 f"{self.engine.max_top_logprobs} top logprobs, it needs {len(self._yes_no)} "
                                 "(use backend local or openai, or parser score_line / json)")

    async def close(self) -> None:
        await self.engine.close()

    def encode(self, messages: list[dict]) -> list[int]:
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return list(tok.encode(text, add_special_tokens=False))
        text = "\n\n".join(m["content"] for m in messages) + "\n"
        return list(tok.encode(text))

    async def ask(self, messages: list[dict], *, max_tokens: int, temperature: float, yes_no: bool) -> Reply:
        from rollout_service.engines import GenerateRequest, SamplingParams

        if yes_no:
            sp = SamplingParams(temperature=0.0, max_new_tokens=1, allowed_token_ids=list(self._yes_no),
                                top_logprobs=len(self._yes_no))
        else:
            sp = SamplingParams(temperature=temperature, max_new_tokens=max_tokens)
        req = GenerateRequest(prompt_ids=self.encode(messages), sampling=sp)
        try:
            if self._slots is None:
                res = await asyncio.wait_for(self.engine.generate(req), self.cfg.request_timeout_s)
            else:
                async with self._slots:
                    res = await asyncio.wait_for(self.engine.generate(req), self.cfg.request_timeout_s)
        except asyncio.TimeoutError:
            raise JudgeUnavailable(f"the {self.name} judge engine gave no answer in "
                                   f"{self.cfg.request_timeout_s:g} s") from None
        except ValueError:
            raise  # a prompt over the judge's context, a bad setting: the caller says which completion
        except Exception as exc:
            raise JudgeUnavailable(f"the {self.name} judge engine failed: {type(exc).__name__}: {exc}") from exc
        if yes_no:
            first = res.top_logprobs[0] if res.top_logprobs else []
            return Reply(top=[(self.tokenizer.decode([t]), lp) for t, lp in first])
        return Reply(text=self.tokenizer.decode(res.output_ids, skip_special_tokens=True))


def yes_no_ids(tokenizer: Any) -> list[int]:
    """The single-token spellings of yes and no ("Yes", " yes", ...) in this vocabulary."""
    ids: list[int] = []
    for word in ("Yes", "yes", " Yes", " yes", "YES", "No", "no", " No", " no", "NO"):
        enc = tokenizer.encode(word, add_special_tokens=False)
        if len(enc) == 1 and enc[0] not in ids:
            ids.append(enc[0])
    have = {tokenizer.decode([i]).strip().lower() for i in ids}
    if have != {"yes", "no"}:
        raise ValueError("reward.judge.parser yes_no: the judge's vocabulary has no single-token 'yes' and 'no'")
    return ids


def read_api_key(cfg: JudgeConfig) -> str:
    """The endpoint's key: the 0600 file `api_key_file`, else the variable `api_key_env` ('' = none)."""
    if cfg.api_key_file:
        from shared.runtime.credentials import check_private

        return check_private(cfg.api_key_file, "reward.judge.api_key_file").read_text().strip()
    return os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""


class OpenAIBackend(Backend):
    """A judge behind an OpenAI-compatible endpoint (`judge.base_url`, `judge.model`): the official client,
    no retries of its own (a failure takes the reward protocol's error path), `request_timeout_s` a call."""

    name = "openai"

    def __init__(self, cfg: JudgeConfig):
        if not cfg.base_url:
            raise ValueError("reward.judge.base_url: the openai backend needs the endpoint's base URL")
        if not cfg.model:
            raise ValueError("reward.judge.model: the openai backend needs the model name to send")
        self.cfg = cfg
        self.key = read_api_key(cfg)  # here, so that building the judge checks the key file (SecretFileError)
        self.client = None

    async def start(self) -> None:
        from openai import AsyncOpenAI

        # a local server needs no key, but the client refuses an empty one: send a placeholder, never a secret
        self.client = AsyncOpenAI(base_url=self.cfg.base_url, api_key=self.key or "none",
                                  timeout=self.cfg.request_timeout_s, max_retries=0)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()

    async def ask(self, messages: list[dict], *, max_tokens: int, temperature: float, yes_no: bool) -> Reply:
        import openai

        kw: dict[str, Any] = {"model": self.cfg.model, "messages": messages, "temperature": temperature}
        if yes_no:
            kw.update(max_tokens=1, temperature=0.0, logprobs=True, top_logprobs=20)
        else:
            kw["max_tokens"] = max_tokens
        try:
            resp = await self.client.chat.completions.create(**kw)
        except openai.APITimeoutError:
            raise JudgeUnavailable(f"the judge endpoint {self.cfg.base_url} gave no answer in "
                                   f"{self.cfg.request_timeout_s:g} s") from None
        except openai.APIStatusError as exc:
            raise JudgeUnavailable(f"the judge endpoint {self.cfg.base_url} answered HTTP {exc.status_code}: "
                                   f"{str(exc.message)[:300]}") from None
        except openai.APIError as exc:
            raise JudgeUnavailable(f"the judge endpoint {self.cfg.base_url}: {type(exc).__name__}: {exc}") from None
        if not resp.choices:
            raise JudgeUnavailable(f"the judge endpoint {self.cfg.base_url} answered with no choices")
        ch = resp.choices[0]
        if yes_no:
            content = ch.logprobs.content if ch.logprobs is not None and ch.logprobs.content else []
            if not content:
                raise JudgeUnavailable(f"the judge endpoint {self.cfg.base_url} returned no logprobs "
                                       "(parser yes_no needs logprobs and top_logprobs)")
            return Reply(top=[(t.token, t.logprob) for t in content[0].top_logprobs or []])
        return Reply(text=ch.message.content or "")


def make_backend(cfg: JudgeConfig) -> Backend:
    if cfg.backend == "openai":
        return OpenAIBackend(cfg)
    return EngineBackend(cfg)
