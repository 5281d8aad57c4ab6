"""`local`: a torch + transformers causal LM in this process, with continuous batching.

One asyncio task drives the loop; each iteration runs one model step in a single worker thread
(`run_in_executor`), so the event loop (NATS heartbeats, new requests) stays responsive while torch
computes. Only that thread touches the model and the KV cache. An iteration:

1. applies a pending weight swap (between steps, never inside one); with `recompute_kv_on_swap`
   every running sequence is re-prefilled from its tokens under the new weights,
2. prefills up to `max_prefill_batch` waiting requests together (left-padded) and samples their first
   token; their rows join the running batch (kvbatch.KVBatch). Requests with the same tokens (a
   group's samples of one prompt) are prefilled once and get copies of that row (`share_prefill`),
3. decodes one token for every running row, then drops the rows that finished.

A LoRA version (a PEFT adapter dir, shared/model/adapters.py) is merged into the served weights in place, on
top of a copy of the base tensors it touches (kept from the first adapter on): W = W_base + alpha/r B A,
so the base is never reloaded and the forward costs what the plain model costs.

Logprobs are those of the raw model distribution (log_softmax of the logits, before temperature /
top-k / top-p), like vLLM's default, restricted to `sampling.allowed_token_ids` when set (the trainer
applies the same mask); the tokens are drawn from the filtered distribution with the
request's own torch.Generator, so a seeded request gives the same tokens alone or in any batch.

`sampling.constraint` (a JSON schema or Lark grammar, engines/constraint.py) adds a per-sequence mask from
its llguidance matcher to the same masking: the sampled token and its recorded logprob come from the
masked distribution. `sampling.top_logprobs` k returns, per token, the k most likely ids of that same
distribution.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rollout_service.engines.base import Engine, GenerateRequest, GenerateResult
from rollout_service.engines.constraint import KINDS, GrammarMatcher
from rollout_service.engines.kvbatch import KVBatch, select_rows
from rollout_service.engines.sampling import StopChecker, make_generator, sample_rows
from shared.config import JetrlConfig
from shared.model.adapters import is_adapter_dir, merged_weights, read_adapter
from shared.model.logits_mask import allowed_vector, mask_logits

log = logging.getLogger(__name__)


@dataclass
class _Seq:
    req: GenerateRequest
    future: asyncio.Future
    stop: StopChecker
    generator: torch.Generator | None
    tokens: list[int]  # prompt + output; the last one is not in the KV cache yet
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)  # sampling.top_logprobs per token
    matcher: GrammarMatcher | None = None  # sampling.constraint's state
    finish_reason: str | None = None
    aborted: bool = False
    t_enqueued: float = field(default_factory=time.monotonic)
    t_started: float = 0.0
    t_prefilled: float = 0.0


@dataclass
class _Swap:
    version: int
    path: str | None
    state_dict: dict | None
    done: asyncio.Future


def load_weights_dir(path: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of the *.safetensors files in a model dir (or one file)."""
    from safetensors.torch import load_file

    p = Path(path)
    files = [p] if p.is_file() else sorted(p.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"update_weights: no *.safetensors in {p}")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(str(f)))
    return sd


class LocalEngine(Engine):
    name = "local"
    constraint_kinds = KINDS
    max_top_logprobs = 20

    def __init__(self, cfg: JetrlConfig, model=None, tokenizer=None, version: int = 0):
        self.cfg = cfg
        self.opts = cfg.rollout.local
        self.device = torch.device(cfg.rollout.device)
        self.model, self.tokenizer = model, tokenizer
        self._version = version
        self.configured_max_prompt = cfg.rollout.service.max_prompt_tokens
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []  # row i of self._kv
        self._reprefill: list[_Seq] = []  # running, but their cache must be rebuilt (after a swap)
        self._kv = KVBatch()
        self._swaps: list[_Swap] = []
        self._paused = False
        self._closed = False
        self._wake = asyncio.Event()
        self._step_idle = asyncio.Event()  # set while no model step runs
        self._step_idle.set()
        self._task: asyncio.Task | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._cache_kwarg: str | None = None
        self._extra: dict[str, Any] = {}
        self._lora_base: dict[str, torch.Tensor] = {}  # base values of the tensors adapters change
        self._tokens_total = 0
        self._prefill_rows = 0  # prompt rows run through prefill (fewer than sequences with share_prefill)
        self._steps = 0
        self._t0 = time.monotonic()

    # ---------------------------------------------------------------- lifecycle

    @property
    def version(self) -> int:
        return self._version

    async def start(self) -> None:
        if self._task is not None:
            return
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="jetrl-local-engine"
        )
        loop = asyncio.get_running_loop()
        if self.opts.torch_threads:
            await loop.run_in_executor(self._executor, torch.set_num_threads, self.opts.torch_threads)
        if self.model is None:
            from shared.model.tinymodel import load_policy

            self.model, self.tokenizer = await loop.run_in_executor(
                self._executor, load_policy, self.cfg.model, str(self.device)
            )
        self.model.eval()
        ctx_len = getattr(self.model.config, "max_position_embeddings", None)
        self.context_tokens = int(ctx_len) if isinstance(ctx_len, int) and ctx_len > 0 else None
        self.eos_token_id = (
            getattr(self.tokenizer, "eos_token_id", None) if self.tokenizer is not None else None
        )
        if self.eos_token_id is None:
            self.eos_token_id = getattr(self.model.config, "eos_token_id", None)
        if isinstance(self.eos_token_id, list):
            self.eos_token_id = self.eos_token_id[0]
        self._t0 = time.monotonic()
        self._task = asyncio.create_task(self._loop(), name="jetrl-local-engine-loop")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for seq in [*self._waiting, *self._running, *self._reprefill]:
            self._finish(seq, "abort")
        self._waiting.clear()
        for swap in self._swaps:
            if not swap.done.done():
                swap.done.set_exception(RuntimeError("engine closed before the weight swap"))
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, timeout=30)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self._task.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    # ---------------------------------------------------------------- API

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        if self._task is None:
            raise RuntimeError("LocalEngine.generate before start()")
        if self._closed:
            raise RuntimeError("LocalEngine is closed")
        self.check_request(req)
        vocab = int(self.model.config.vocab_size)
        bad = [t for t in req.prompt_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"generate: prompt token ids {bad[:5]} outside the vocabulary [0, {vocab})")
        allowed_vector(req.sampling.allowed_token_ids, vocab)  # ids outside the vocabulary: ValueError
        seq = _Seq(
            req=req,
            future=asyncio.get_running_loop().create_future(),
            stop=StopChecker(req.sampling, self.eos_token_id, self.tokenizer),
            generator=None
            if req.sampling.temperature == 0
            else make_generator(req.sampling.seed, self.device),
            tokens=list(req.prompt_ids),
        )
        if req.sampling.constraint is not None:
            if self.tokenizer is None:
                raise ValueError("sampling.constraint: constrained decoding needs the engine's tokenizer")
            seq.matcher = GrammarMatcher(req.sampling.constraint, self.tokenizer, vocab)
        self._waiting.append(seq)
        self._wake.set()
        try:
            return await asyncio.shield(seq.future)
        except asyncio.CancelledError:  # the caller is gone (a client disconnected): free its batch slot
            await self.abort(req.request_id)
            raise

    async def update_weights(
        self, version: int, path: str | None = None, state_dict: dict | None = None
    ) -> None:
        if (path is None) == (state_dict is None):
            raise ValueError("update_weights: give exactly one of path or state_dict")
        if self._task is None or self._closed:
            raise RuntimeError("LocalEngine.update_weights needs a started, open engine")
        swap = _Swap(version, path, state_dict, asyncio.get_running_loop().create_future())
        self._swaps.append(swap)
        self._wake.set()
        await swap.done

    async def pause(self) -> None:
        """Returns once the step in progress (if any) has ended: no token is produced after it."""
        self._paused = True
        await self._step_idle.wait()

    async def resume(self) -> None:
        self._paused = False
        self._wake.set()

    async def abort(self, request_id: str | None = None) -> int:
        n = 0
        for seq in list(self._waiting):
            if request_id is None or seq.req.request_id == request_id:
                self._waiting.remove(seq)
                self._finish(seq, "abort")
                n += 1
        for seq in [*self._running, *self._reprefill]:
            if (request_id is None or seq.req.request_id == request_id) and not seq.aborted:
                seq.aborted = True  # the loop drops it at the next step boundary
                self._finish(seq, "abort")
                n += 1
        self._wake.set()
        return n

    async def health(self) -> dict[str, Any]:
        ok = self._task is not None and not self._task.done()
        return {"ok": ok, "engine": self.name, "version": self._version, "paused": self._paused}

    def stats(self) -> dict[str, float]:
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        return {
            "tokens_generated": float(self._tokens_total),
            "prefill_rows": float(self._prefill_rows),
            "steps": float(self._steps),
            "running": float(len(self._running) + len(self._reprefill)),
            "waiting": float(len(self._waiting)),
            "tokens_per_s": self._tokens_total / elapsed,
            "version": float(self._version),
        }

    # ---------------------------------------------------------------- loop (event-loop side)

    def _finish(self, seq: _Seq, reason: str) -> None:
        if seq.future.done():
            return
        now = time.monotonic()
        seq.finish_reason = reason
        timings = {
            "queue": (seq.t_started or now) - seq.t_enqueued,
            "prefill": (seq.t_prefilled - seq.t_started) if seq.t_prefilled else 0.0,
            "decode": (now - seq.t_prefilled) if seq.t_prefilled else 0.0,
            "total": now - seq.t_enqueued,
        }
        seq.future.set_result(
            GenerateResult(
                request_id=seq.req.request_id,
                prompt_ids=list(seq.req.prompt_ids),
                output_ids=list(seq.output_ids),
                logprobs=list(seq.logprobs),
                versions=list(seq.versions),
                finish_reason=reason,
                timings=timings,
                top_logprobs=[list(t) for t in seq.top] if seq.req.sampling.top_logprobs else None,
            )
        )

    def _has_work(self) -> bool:
        if self._swaps or any(s.aborted for s in self._running):
            return True
        return not self._paused and bool(self._running or self._reprefill or self._waiting)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            if not self._has_work():
                self._wake.clear()
                await self._wake.wait()
                continue
            swaps, self._swaps = self._swaps, []
            self._step_idle.clear()
            try:
                for swap in swaps:  # a bad swap fails its caller only; the running requests go on
                    try:
                        await loop.run_in_executor(self._executor, self._apply_swap, swap)
                    except Exception as e:
                        swap.done.set_exception(e)
                    else:
                        swap.done.set_result(None)
                run = not self._paused
                admit: list[_Seq] = []
                room = self.opts.max_batch - len(self._running) - len(self._reprefill)
                while run and self._waiting and room > 0:
                    seq = self._waiting.popleft()
                    seq.t_started = time.monotonic()
                    admit.append(seq)
                    room -= 1
                finished = await loop.run_in_executor(self._executor, self._step_sync, admit, run)
            except Exception as e:  # a failed step must not hang callers: fail them all, keep serving
                log.exception("local engine step failed")
                for seq in [*admit, *self._running, *self._reprefill]:
                    if not seq.future.done():
                        seq.future.set_exception(RuntimeError(f"local engine step failed: {e!r}"))
                self._running, self._reprefill = [], []
                self._kv.clear()
                continue
            finally:
                self._step_idle.set()
            for seq in finished:
                self._finish(seq, seq.finish_reason or "stop")

    # ---------------------------------------------------------------- one step (worker thread)

    @torch.inference_mode()
    def _step_sync(self, admit: list[_Seq], run: bool) -> list[_Seq]:
        """Drop aborted rows; then, when `run`, prefill `admit` (+ caches to rebuild) and decode one token."""
        finished: list[_Seq] = []
        self._drop_rows(finished, aborted_only=True)
        if not run:
            return finished
        pending = self._reprefill + admit
        self._reprefill = []
        for i in range(0, len(pending), self.opts.max_prefill_batch):
            self._prefill(pending[i : i + self.opts.max_prefill_batch])
        self._drop_rows(finished)
        if self._running:
            self._decode()
            self._drop_rows(finished)
        self._steps += 1
        return finished

    @torch.inference_mode()
    def _apply_swap(self, swap: _Swap) -> None:
        if swap.path is not None and is_adapter_dir(swap.path):
            self._merge_adapter(swap.path)
        else:
            self._load_full(swap)
        self._version = swap.version
        if self.opts.recompute_kv_on_swap and self._running:
            self._reprefill = self._running + self._reprefill
            self._running = []
            self._kv.clear()

    def _merge_adapter(self, path: str) -> None:
        """Served weights = base + this adapter (the previous adapter's changes are undone)."""
        deltas, replace = merged_weights(read_adapter(path))
        own = self.model.state_dict()
        new = {**deltas, **replace}
        unknown = sorted(k for k in new if k not in own)
        wrong = sorted(k for k in new if k in own and tuple(new[k].shape) != tuple(own[k].shape))
        if unknown or wrong:  # checked before changing anything
            raise ValueError(f"LoRA adapter {path}: does not fit the served model (unknown tensors {unknown[:5]}, "
                             f"wrong shape {wrong[:5]})")
        for k in new:
            if k not in self._lora_base:
                self._lora_base[k] = own[k].detach().clone()
        for k, base in self._lora_base.items():
            if k in deltas:
                own[k].copy_((base.float() + deltas[k]).to(own[k].dtype))
            elif k in replace:
                own[k].copy_(replace[k].to(own[k].dtype))
            else:
                own[k].copy_(base)

    def _load_full(self, swap: _Swap) -> None:
        sd = swap.state_dict if swap.state_dict is not None else load_weights_dir(swap.path)
        own = self.model.state_dict()
        tied = getattr(self.model.config, "tie_word_embeddings", False)
        missing = sorted(k for k in own if k not in sd and not (tied and k.endswith("lm_head.weight")))
        unexpected = sorted(k for k in sd if k not in own)
        wrong = sorted(k for k in sd if k in own and tuple(sd[k].shape) != tuple(own[k].shape))
        if missing or unexpected or wrong:  # checked before copying anything: a bad swap changes nothing
            raise ValueError(
                f"update_weights v{swap.version}: state dict does not match the model "
                f"(missing {missing[:5]}, unexpected {unexpected[:5]}, wrong shape {wrong[:5]})"
            )
        self.model.load_state_dict(sd, strict=False)
        self._lora_base = {}  # a full version is the new base

    def _forward(self, input_ids, attention_mask, position_ids, cache):
        if self._cache_kwarg is None:  # transformers >= 5.2x calls it `cache`, older `past_key_values`
            params = inspect.signature(self.model.forward).parameters
            self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
            self._extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=True,
            **self._extra,
            **{self._cache_kwarg: cache},
        )
        return out.logits[:, -1, :].float(), cache

    def _prefill(self, seqs: list[_Seq]) -> None:
        """Run the whole token list of each seq (left-padded) and sample its next token. With
        `share_prefill`, each distinct token list (a group's shared prompt) runs once and its sequences
        get copies of its KV rows and logits; each still samples with its own generator."""
        from transformers import DynamicCache

        distinct: dict[tuple[int, ...], int] = {}
        if self.opts.share_prefill:
            row_of = [distinct.setdefault(tuple(s.tokens), len(distinct)) for s in seqs]
            lists = [list(t) for t in distinct]
        else:
            row_of, lists = list(range(len(seqs))), [s.tokens for s in seqs]
        length = max(len(t) for t in lists)
        ids = torch.zeros((len(lists), length), dtype=torch.long)
        mask = torch.zeros((len(lists), length), dtype=torch.long)
        for i, t in enumerate(lists):
            ids[i, length - len(t) :] = torch.tensor(t)
            mask[i, length - len(t) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
        logits, cache = self._forward(ids, mask, pos, DynamicCache())
        self._prefill_rows += len(lists)
        if len(lists) < len(seqs):
            idx = torch.tensor(row_of, dtype=torch.long, device=self.device)
            cache, mask, logits = select_rows(cache, idx), mask.index_select(0, idx), logits.index_select(0, idx)
        now = time.monotonic()
        for s in seqs:
            if not s.t_prefilled:
                s.t_prefilled = now
        self._kv.append(cache, mask)
        self._running.extend(seqs)
        self._sample(seqs, logits)

    def _decode(self) -> None:
        ids = torch.tensor([[s.tokens[-1]] for s in self._running], dtype=torch.long, device=self.device)
        attention_mask, pos = self._kv.step_inputs()
        logits, _ = self._forward(ids, attention_mask, pos, self._kv.cache)
        self._kv.advance(attention_mask)
        self._sample(self._running, logits)

    def _sample(self, seqs: list[_Seq], logits: torch.Tensor) -> None:
        live = [i for i, s in enumerate(seqs) if not s.aborted]
        if not live:
            return
        logits = logits[live]
        live_seqs = [seqs[i] for i in live]
        logits = self._mask_allowed(logits, live_seqs)
        tokens = sample_rows(logits, [s.req.sampling for s in live_seqs], [s.generator for s in live_seqs])
        all_lps = torch.log_softmax(logits, dim=-1)
        logprobs = all_lps.gather(1, tokens[:, None])[:, 0]
        version = self._version
        for i, (s, tok, lp) in enumerate(zip(live_seqs, tokens.tolist(), logprobs.tolist(), strict=True)):
            s.tokens.append(tok)
            s.output_ids.append(tok)
            s.logprobs.append(lp)
            s.versions.append(version)
            k = s.req.sampling.top_logprobs
            if k:
                top = torch.topk(all_lps[i], k)
                s.top.append(list(zip(top.indices.tolist(), top.values.tolist(), strict=True)))
            s.finish_reason = s.stop.finish_reason(s.output_ids)
            if s.matcher is not None and not s.matcher.consume(tok) and s.finish_reason is None:
                s.finish_reason = "stop"  # the grammar is complete (EOS) or can go no further
            if s.finish_reason is None and self.context_tokens and len(s.tokens) >= self.context_tokens:
                s.finish_reason = "length"  # the model's context is full
        self._tokens_total += len(live_seqs)

    def _mask_allowed(self, logits: torch.Tensor, seqs: list[_Seq]) -> torch.Tensor:
        """sampling.allowed_token_ids: the same logits mask as the trainer's (shared/model/logits_mask.py), so the
        recorded logprobs are those of the softmax over the allowed ids; and, per sequence, the tokens its
        sampling.constraint allows next (the recorded logprob is then that of the masked distribution)."""
        if not any(s.req.sampling.allowed_token_ids or s.matcher is not None for s in seqs):
            return logits
        vocab = logits.shape[-1]
        full = torch.ones(vocab, dtype=torch.bool, device=logits.device)
        rows = []
        for s in seqs:
            r = allowed_vector(s.req.sampling.allowed_token_ids, vocab, logits.device)
            r = full if r is None else r
            if s.matcher is not None:
                r = r & s.matcher.allowed(logits.device)
            rows.append(r)
        return mask_logits(logits, torch.stack(rows))

    def _drop_rows(self, finished: list[_Seq], aborted_only: bool = False) -> None:
        keep, rows = [], []
        for i, s in enumerate(self._running):
            if s.aborted or (not aborted_only and s.finish_reason is not None):
                if not s.aborted:
                    finished.append(s)
            else:
                keep.append(s)
                rows.append(i)
        if len(keep) != len(self._running):
            self._kv.keep(rows)
            self._running = keep
        self._reprefill = [s for s in self._reprefill if not s.aborted]
