"""Shared logic of the HTTP engines (vllm, sglang): interruptible generation with exact token versions.

A generation is a series of segments. Each segment is one plain request to the server, started under
one weight version. A weight swap (1) stops new segments from starting, (2) aborts every segment in
flight on the server and waits until all have returned their partial tokens, (3) loads the new weights
and (4) lets the interrupted generations continue with a new segment whose prompt is the prompt plus
every token so far (the server recomputes their KV cache under the new weights: the AReaL recipe).
No token can be produced by one version and labelled with another, whatever the server's timing.

Subclasses implement the server calls: `_segment`, `_abort_segments`, `_load_weights`, `_pause_server`,
`_resume_server`.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from rollout_service.engines.base import Engine, EngineDead, GenerateRequest, GenerateResult, SamplingParams
from shared.io.linktree import link_tree
from shared.model.adapters import is_adapter_dir

log = logging.getLogger(__name__)


@dataclass
class Segment:
    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "abort"


@dataclass
class _Gen:
    req: GenerateRequest
    segment_id: str | None = None  # the server-side id of the segment in flight
    user_aborted: bool = False
    n_segments: int = 0
    t_start: float = field(default_factory=time.monotonic)


# A request that never got an answer because its connection failed: refused, reset, or closed before the
# response. Time-outs (httpx.TimeoutException) are not here: the request may still be running.
CONNECTION_ERRORS = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)


class EngineHTTPError(RuntimeError):
    """The server answered an engine call with an error; the message names the endpoint and the body."""


class RemoteEngine(Engine, abc.ABC):
    def __init__(self, url: str, request_timeout_s: float, weights_dir: str = "", version: int = 0,
                 connection_retries: int = 2):
        self.url = url.rstrip("/")
        self.request_timeout_s = request_timeout_s
        self.connection_retries = connection_retries
        self.weights_dir = weights_dir
        self._adapter_snapshot: Path | None = None
        self._version = version
        self._client: httpx.AsyncClient | None = None
        self._gens: dict[str, _Gen] = {}
        self._in_flight = 0  # segments sent and not yet returned
        self._idle = asyncio.Event()  # set when _in_flight == 0
        self._idle.set()
        self._open = asyncio.Event()  # cleared while a weight swap is in progress
        self._open.set()
        self._swap_lock = asyncio.Lock()
        self._user_paused = False
        self._tokens_total = 0
        self._interrupted = 0
        self._retried = 0  # segments sent again after their connection failed
        self._t0 = time.monotonic()
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._aborts: set[asyncio.Task] = set()  # aborts of cancelled segments still being sent

    @property
    def version(self) -> int:
        return self._version

    # ---------------------------------------------------------------- server calls (subclasses)

    @abc.abstractmethod
    async def _segment(self, segment_id: str, prompt_ids: list[int], sampling: SamplingParams) -> Segment: ...

    @abc.abstractmethod
    async def _abort_segments(self, segment_ids: list[str] | None) -> None:
        """Abort these server-side requests (None = everything the server runs)."""

    @abc.abstractmethod
    async def _load_weights(self, version: int, path: str) -> None: ...

    @abc.abstractmethod
    async def _pause_server(self) -> None:
        """Freeze in-flight requests without losing them (user pause)."""

    @abc.abstractmethod
    async def _resume_server(self) -> None: ...

    # ---------------------------------------------------------------- HTTP helpers

    async def start(self) -> None:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.request_timeout_s, connect=10.0))
        self._t0 = time.monotonic()

    async def close(self) -> None:
        if self._gens:
            try:
                await self.abort(None)
            except Exception:  # the server may be gone already
                log.warning("could not abort in-flight requests on close", exc_info=True)
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _server_exit(self) -> str | None:
        """Why the server can never answer again (a server this engine started has exited), else None.
        Only engines that start their server can tell; the others leave the error to the caller."""
        return None

    @property
    def _owns_server(self) -> bool:
        return False

    async def _request(self, method: str, path: str, **kw) -> Any:
        if self._client is None:
            raise RuntimeError(f"{self.name} engine: call start() first")
        try:
            r = await self._client.request(method, self.url + path, **kw)
        except httpx.TransportError:
            await self._raise_if_dead()
            raise
        if r.status_code >= 400:
            if r.status_code >= 500:
                await self._raise_if_dead()
            raise EngineHTTPError(
                f"{self.name}: {method} {self.url}{path} -> HTTP {r.status_code}: {r.text[:500]}"
            )
        if not r.content:
            return None
        try:
            return r.json()
        except ValueError:  # a plain-text answer (vLLM's /v1/load_lora_adapter)
            return r.text

    async def _raise_if_dead(self) -> None:
        if not self._owns_server:
            return
        # A server whose engine core died answers 500 for a moment before it exits: give it that moment.
        for _ in range(10):
            why = self._server_exit()
            if why is not None:
                raise EngineDead(f"{self.name} engine at {self.url}: {why}")
            await asyncio.sleep(0.2)

    async def _post(self, path: str, json: Any = None, params: dict | None = None) -> Any:
        return await self._request("POST", path, json=json, params=params)

    async def _get(self, path: str) -> Any:
        return await self._request("GET", path)

    # ---------------------------------------------------------------- Engine API

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        self.check_request(req)  # no constraint nor top_logprobs through segments yet
        if req.request_id in self._gens:
            raise ValueError(f"generate: request_id {req.request_id!r} is already running")
        gen = _Gen(req)
        self._gens[req.request_id] = gen
        out_ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        finish = "abort"
        failures = 0  # segments whose connection failed (retried up to connection_retries)
        try:
            while not gen.user_aborted:
                await self._open.wait()
                if gen.user_aborted:
                    break
                version = self._version
                remaining = req.sampling.max_new_tokens - len(out_ids)
                segment_id = gen.segment_id = f"{req.request_id}-{gen.n_segments}"
                gen.n_segments += 1
                self._in_flight += 1
                self._idle.clear()
                lost = None
                try:
                    seg = await self._segment(
                        segment_id,
                        list(req.prompt_ids) + out_ids,
                        replace(req.sampling, max_new_tokens=remaining),
                    )
                except CONNECTION_ERRORS as exc:
                    if failures >= self.connection_retries:
                        raise
                    failures += 1
                    lost = exc
                except asyncio.CancelledError:  # the caller is gone: the server must not go on generating
                    gen.user_aborted = True
                    self._abort_in_background(segment_id)
                    raise
                finally:
                    self._in_flight -= 1
                    if self._in_flight == 0:
                        self._idle.set()
                    gen.segment_id = None
                if lost is not None:  # out of flight while it waits, so a weight swap need not
                    await self._before_retry(segment_id, lost, failures)
                    continue
                out_ids += seg.output_ids
                logprobs += seg.logprobs
                versions += [version] * len(seg.output_ids)
                self._tokens_total += len(seg.output_ids)
                finish = seg.finish_reason
                if finish != "abort" or gen.user_aborted:
                    break
                if len(out_ids) >= req.sampling.max_new_tokens:
                    finish = "length"
                    break
                if self._open.is_set() and self._version == version:
                    # aborted by someone else (another client, the server): not a swap, so report it
                    break
                self._interrupted += 1
        finally:
            self._gens.pop(req.request_id, None)
        if gen.user_aborted:
            finish = "abort"
        total = time.monotonic() - gen.t_start
        return GenerateResult(
            request_id=req.request_id,
            prompt_ids=list(req.prompt_ids),
            output_ids=out_ids,
            logprobs=logprobs,
            versions=versions,
            finish_reason=finish,
            timings={"total": total, "segments": float(gen.n_segments)},
        )

    def _abort_in_background(self, segment_id: str) -> None:
        """Abort a segment whose caller was cancelled (its own task cannot await any more)."""

        async def abort() -> None:
            try:
                await self._abort_segments([segment_id])
            except Exception:
                log.warning("%s engine: abort of cancelled segment %s failed", self.name, segment_id, exc_info=True)

        task = asyncio.get_running_loop().create_task(abort())
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    async def _before_retry(self, segment_id: str, exc: Exception, attempt: int) -> None:
        """A segment's connection failed: abort it on the server in case it still runs there (the answer is
        lost either way), wait 0.5 s x attempt, and let the caller send it again under a new id."""
        self._retried += 1
        log.warning("%s engine: %s on segment %s (%s); sending it again (%d of %d)", self.name,
                    type(exc).__name__, segment_id, exc, attempt, self.connection_retries)
        try:
            await self._abort_segments([segment_id])
        except Exception:  # the server may be unreachable right now: the retry tells
            log.debug("abort of segment %s before its retry failed", segment_id, exc_info=True)
        await asyncio.sleep(0.5 * attempt)

    async def update_weights(
        self, version: int, path: str | None = None, state_dict: dict | None = None
    ) -> None:
        if (path is None) == (state_dict is None):
            raise ValueError("update_weights: give exactly one of path or state_dict")
        if state_dict is not None:
            snapshot = self._write_state_dict(version, state_dict)
        else:
            # The server reads the files after a pause, seconds later maybe: give it a private snapshot
            # (hard links, else copies), since the weight store's retention may delete a version in place.
            snapshot = await asyncio.to_thread(self._snapshot, version, Path(path))
        path = str(snapshot)
        async with self._swap_lock:
            self._open.clear()
            try:
                while self._in_flight:
                    ids = [g.segment_id for g in self._gens.values() if g.segment_id]
                    await self._abort_segments(ids or None)
                    try:
                        await asyncio.wait_for(self._idle.wait(), timeout=0.2)
                    except asyncio.TimeoutError:
                        pass  # a segment sent just before the swap: abort again
                await self._load_weights(version, path)
                self._version = version
            except BaseException:
                shutil.rmtree(snapshot, ignore_errors=True)
                raise
            else:
                if is_adapter_dir(snapshot):
                    # A server may evict an adapter from its cache and read it again: keep the newest
                    # adapter's files until the next version replaces it.
                    old, self._adapter_snapshot = self._adapter_snapshot, snapshot
                    if old is not None and old != snapshot:
                        shutil.rmtree(old, ignore_errors=True)
                else:
                    shutil.rmtree(snapshot, ignore_errors=True)  # the server holds the weights in memory now
            finally:
                self._open.set()

    def _version_dir(self, version: int) -> Path:
        """A fresh dir for version `version` under weights_dir (or a temp dir) that the server can read."""
        root = self.weights_dir
        if not root:
            if self._tmp is None:
                self._tmp = tempfile.TemporaryDirectory(prefix=f"jetrl-{self.name}-weights-")
            root = self._tmp.name
        out = Path(root) / f"v{version}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        return out

    def _snapshot(self, version: int, src: Path) -> Path:
        return link_tree(src, self._version_dir(version))

    def _write_state_dict(self, version: int, state_dict: dict) -> Path:
        """Save an in-memory state dict as safetensors where the server can read it (same host / shared FS)."""
        from safetensors.torch import save_file

        out = self._version_dir(version)
        save_file(
            {k: v.detach().contiguous().cpu() for k, v in state_dict.items()}, str(out / "model.safetensors")
        )
        return out

    async def pause(self) -> None:
        self._user_paused = True
        await self._pause_server()

    async def resume(self) -> None:
        self._user_paused = False
        await self._resume_server()

    async def abort(self, request_id: str | None = None) -> int:
        gens = [g for rid, g in self._gens.items() if request_id is None or rid == request_id]
        for g in gens:
            g.user_aborted = True
        ids = [g.segment_id for g in gens if g.segment_id]
        if ids:
            await self._abort_segments(ids)
        return len(gens)

    def stats(self) -> dict[str, float]:
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        return {
            "tokens_generated": float(self._tokens_total),
            "running": float(len(self._gens)),
            "segments_in_flight": float(self._in_flight),
            "interrupted_by_swap": float(self._interrupted),
            "connection_retries": float(self._retried),
            "tokens_per_s": self._tokens_total / elapsed,
            "version": float(self._version),
        }
