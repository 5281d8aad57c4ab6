"""`sim`: a latency model of a GPU inference server, to benchmark orchestration at scale on a CPU.

It behaves like a continuous-batching server: at most `max_concurrency` sequences run, the rest queue.
Each iteration admits waiting requests, then every running sequence gains one token. The iteration
lasts (simulated seconds)

    prefill_time(sum of the admitted prompts' lengths)            [0 when nothing is admitted]
  + decode_step_time(running sequences, sum of their contexts)    [context = prompt + tokens so far]

and the engine sleeps that long times `time_scale` (0 = no sleeping). Iterations that can change nothing but
the tokens (nothing to admit, no sequence ending before the last of them, no weight update) are slept
together, up to MAX_SLEEP_S of wall time, and woken early by a request, an update, a pause or close: the
same simulated times and tokens, a fraction of the wake-ups when hundreds of engines share a few cores. A request's output length is drawn
from a log-normal (median `output_len_median`, sigma `output_len_sigma`), clipped to [1, max_new_tokens];
a generation shorter than max_new_tokens ends with `eos_token_id` ("stop"). Tokens and logprobs are
random but real arrays, with the version of the weights at the iteration that produced each token. The
result's timings are simulated seconds; `virtual_clock` is the simulated time since start.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from rollout_service.engines.base import Engine, GenerateRequest, GenerateResult
from shared.config import JetrlConfig
from shared.config.engines import SimEngineConfig

MAX_SLEEP_S = 0.05  # the longest wall-clock sleep over several decode steps (see SimEngine._loop)


def prefill_time(o: SimEngineConfig, prompt_tokens: int) -> float:
    return o.prefill_base_s + o.prefill_s_per_token * prompt_tokens if prompt_tokens > 0 else 0.0


def decode_step_time(o: SimEngineConfig, batch: int, context_tokens: int) -> float:
    if batch <= 0:
        return 0.0
    return o.decode_base_s + o.decode_s_per_seq * batch + o.decode_s_per_ctx_token * context_tokens


def draw_output_len(rng: np.random.Generator, o: SimEngineConfig, max_new_tokens: int) -> int:
    n = o.output_len_median * math.exp(o.output_len_sigma * rng.standard_normal())
    return int(min(max(1, round(n)), max_new_tokens))


@dataclass
class _SimSeq:
    req: GenerateRequest
    future: asyncio.Future
    rng: np.random.Generator
    target: int
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    t_enqueued: float = 0.0  # virtual clock
    t_admitted: float | None = None
    t_first: float | None = None


class SimEngine(Engine):
    name = "sim"

    def __init__(self, cfg: JetrlConfig, version: int = 0):
        self.opts = cfg.rollout.sim
        self.configured_max_prompt = cfg.rollout.service.max_prompt_tokens  # the sim has no context of its own
        self._version = version
        self._pending_version: int | None = None
        self._rng = np.random.default_rng(self.opts.seed)
        self._waiting: deque[_SimSeq] = deque()
        self._running: list[_SimSeq] = []
        self._paused = False
        self._closed = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.virtual_clock = 0.0
        self.peak_running = 0
        self._tokens_total = 0
        self._t0 = time.monotonic()

    @property
    def version(self) -> int:
        return self._version

    async def start(self) -> None:
        if self._task is None:
            self._t0 = time.monotonic()
            self._task = asyncio.create_task(self._loop(), name="jetrl-sim-engine")

    async def close(self) -> None:
        self._closed = True
        await self.abort(None)
        self._wake.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        if self._task is None or self._closed:
            raise RuntimeError("SimEngine.generate needs a started, open engine")
        self.check_request(req)
        rng = np.random.default_rng(req.sampling.seed) if req.sampling.seed is not None else self._rng
        seq = _SimSeq(
            req=req,
            future=asyncio.get_running_loop().create_future(),
            rng=rng,
            target=draw_output_len(rng, self.opts, req.sampling.max_new_tokens),
            t_enqueued=self.virtual_clock,
        )
        self._waiting.append(seq)
        self._wake.set()
        try:
            return await asyncio.shield(seq.future)
        except asyncio.CancelledError:  # the caller is gone: its sequence leaves the batch
            await self.abort(req.request_id)
            raise

    async def update_weights(
        self, version: int, path: str | None = None, state_dict: dict | None = None
    ) -> None:
        """The sim holds no weights: the version switches at the next iteration boundary."""
        self._pending_version = version
        if not (self._running or self._waiting) or self._paused:
            self._version, self._pending_version = version, None
        self._wake.set()
        while self._pending_version is not None and not self._closed:
            await asyncio.sleep(0)

    async def pause(self) -> None:
        self._paused = True
        self._wake.set()

    async def resume(self) -> None:
        self._paused = False
        self._wake.set()

    async def abort(self, request_id: str | None = None) -> int:
        n = 0
        for q in (self._waiting, self._running):
            for s in list(q):
                if request_id is None or s.req.request_id == request_id:
                    q.remove(s)
                    self._finish(s, "abort")
                    n += 1
        return n

    def stats(self) -> dict[str, float]:
        return {
            "tokens_generated": float(self._tokens_total),
            "running": float(len(self._running)),
            "waiting": float(len(self._waiting)),
            "peak_running": float(self.peak_running),
            "virtual_clock_s": self.virtual_clock,
            "tokens_per_virtual_s": self._tokens_total / max(self.virtual_clock, 1e-9),
            "version": float(self._version),
        }

    def _finish(self, s: _SimSeq, reason: str) -> None:
        if s.future.done():
            return
        now = self.virtual_clock
        s.future.set_result(
            GenerateResult(
                request_id=s.req.request_id,
                prompt_ids=list(s.req.prompt_ids),
                output_ids=s.output_ids,
                logprobs=s.logprobs,
                versions=s.versions,
                finish_reason=reason,
                timings={
                    "queue": (now if s.t_admitted is None else s.t_admitted) - s.t_enqueued,
                    "prefill": 0.0 if s.t_first is None else s.t_first - s.t_admitted,
                    "decode": 0.0 if s.t_first is None else now - s.t_first,
                    "total": now - s.t_enqueued,
                },
            )
        )

    async def _loop(self) -> None:
        o = self.opts
        while not self._closed:
            if self._paused or not (self._running or self._waiting):
                if self._pending_version is not None:
                    self._version, self._pending_version = self._pending_version, None
                self._wake.clear()
                await self._wake.wait()
                continue
            if self._pending_version is not None:
                self._version, self._pending_version = self._pending_version, None
            admitted = []
            while self._waiting and len(self._running) < o.max_concurrency:
                s = self._waiting.popleft()
                s.t_admitted = self.virtual_clock
                admitted.append(s)
                self._running.append(s)
            self.peak_running = max(self.peak_running, len(self._running))
            batch = len(self._running)
            context = sum(len(s.req.prompt_ids) + len(s.output_ids) for s in self._running)
            t_prefill = prefill_time(o, sum(len(s.req.prompt_ids) for s in admitted))
            # Steps that change nothing but the tokens (no admission possible, no sequence ending before
            # the last of them) are slept in one go, woken early by a new request, a weight update, a
            # pause or close: the finished steps' tokens come out as if stepped one by one. The same
            # virtual times; a fraction of the wake-ups (hundreds of sim engines on a few cores).
            self._wake.clear()
            steps = 1
            if (o.time_scale > 0 and not admitted and self._pending_version is None and not self._paused
                    and (not self._waiting or batch >= o.max_concurrency)):
                steps = min(s.target - len(s.output_ids) for s in self._running)
                # at most MAX_SLEEP_S of wall time, so the token counters move while a long generation runs
                steps = max(1, min(steps, int(MAX_SLEEP_S / (decode_step_time(o, batch, context) * o.time_scale))))
            dts = [decode_step_time(o, batch, context + i * batch) for i in range(steps)]
            dts[0] += t_prefill
            if o.time_scale <= 0:
                await asyncio.sleep(0)
            elif steps == 1:
                await asyncio.sleep(dts[0] * o.time_scale)
            else:
                steps = await self._sleep_steps(dts, o.time_scale)
            for s in admitted:
                s.t_first = s.t_admitted + t_prefill
            for dt in dts[:steps]:
                self.virtual_clock += dt
                self._step(o)

    async def _sleep_steps(self, dts: list[float], scale: float) -> int:
        """Sleep the steps `dts` (simulated seconds) until they are all done or `_wake` is set; returns how
        many steps are done, the one in progress at a wake-up finished first (at least one)."""
        t0 = time.monotonic()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), sum(dts) * scale)
        elapsed = (time.monotonic() - t0) / scale
        done, t = 0, 0.0
        for dt in dts:
            t += dt
            done += 1
            if t >= elapsed:  # the step in progress (or the last) ends at t
                break
        if t > elapsed:
            await asyncio.sleep((t - elapsed) * scale)
        return done

    def _step(self, o: SimEngineConfig) -> None:
        """One decode step: a token for every running sequence; the ones that reached their length end."""
        done = []
        for s in self._running:
            last = len(s.output_ids) + 1 == s.target
            stop = last and s.target < s.req.sampling.max_new_tokens
            tok = o.eos_token_id if stop else int(s.rng.integers(4, o.vocab_size))
            s.output_ids.append(tok)
            s.logprobs.append(float(-s.rng.exponential(1.0)))
            s.versions.append(self._version)
            self._tokens_total += 1
            if last:
                done.append((s, "stop" if stop else "length"))
        for s, reason in done:
            self._running.remove(s)
            self._finish(s, reason)
