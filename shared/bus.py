"""NATS plumbing every service uses: connect, ensure streams, publish, and the durable consumer loop.

The consumer loop is where delivery guarantees live (docs/protocol.md, "Ack rules"):
- messages are fetched in batches from a durable pull consumer and handled concurrently (bounded);
  with few slots free it waits up to 50 ms for more before fetching, so quick handlers get big fetches;
- while a handler runs, in-progress acks (one heartbeat task for all handlers, every ack_wait/3) keep
  JetStream from redelivering it;
- success -> ack; `Transient` (or any other exception) -> nak with back-off, until the message has been
  delivered `max_deliver` times; then, and for a message that cannot be decoded or that the handler
  `Reject`s (over a bound), a DeadLetter with the original bytes and the reason goes to the DLQ stream
  and the message is terminated. A letter that would exceed max_payload (headers counted) keeps reason,
  headers, size and sha256 without the payload: the server would close the connection otherwise;
- a connection closed for good (nats-py does not reconnect after a protocol error) ends `run()` with
  ConnectionClosed, so the service exits and is restarted instead of retrying a dead connection;
- a message redelivered more than `max_deliver` times (its last handler crashed) is dead-lettered too;
  the consumer itself has no server-side max_deliver, because a WorkQueue message that exhausts it is
  never delivered again and silently stays in the stream (../shared/notes/measured.md).
- cancelling `run()` cancels its handlers (no ack: redelivered after ack_wait, like a crash); `stop()`
  lets them finish and returns after the current fetch (at most fetch_timeout_s).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import ssl
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError

from shared import codec, subjects
from shared.config import NatsConfig, StreamsConfig
from shared.messages import DeadLetter, Event

log = logging.getLogger("jetrl.bus")


# --- connect --------------------------------------------------------------------------------------


def _tls_context(cfg: NatsConfig) -> ssl.SSLContext | None:
    if not (cfg.tls_ca or cfg.tls_cert):
        return None
    ctx = ssl.create_default_context(cafile=cfg.tls_ca or None)
    if cfg.tls_cert:
        ctx.load_cert_chain(cfg.tls_cert, cfg.tls_key or None)
    return ctx


async def connect(cfg: NatsConfig, name: str = "jetrl", servers: list[str] | None = None) -> NATS:
    """Connect with endless reconnects. The first connection is retried with exponential back-off."""

    async def on_disconnect() -> None:
        if nc.is_closed:  # close() reports a disconnect too
            return
        log.warning("nats: disconnected (%s); reconnecting", name)

    async def on_reconnect() -> None:
        log.info("nats: reconnected to %s (%s)", nc.connected_url.netloc if nc.connected_url else "?", name)

    async def on_error(exc: Exception) -> None:
        log.warning("nats: %s: %s", type(exc).__name__, exc)

    async def on_closed() -> None:
        log.info("nats: connection closed (%s)", name)

    opts: dict[str, Any] = dict(
        name=cfg.name or name,
        connect_timeout=cfg.connect_timeout_s,
        allow_reconnect=True,
        max_reconnect_attempts=-1,
        reconnect_time_wait=cfg.reconnect_wait_s,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
        error_cb=on_error,
        closed_cb=on_closed,
        # Buffer publishes while reconnecting (bounded), instead of failing them at once.
        pending_size=64 * 1024 * 1024,
    )
    if cfg.user:
        opts.update(user=cfg.user, password=cfg.secret("password"))
    token = cfg.secret("token")
    if token:
        opts["token"] = token
    if cfg.creds_file:
        opts["user_credentials"] = cfg.creds_file
    if cfg.nkey_seed_file:
        opts["nkeys_seed"] = cfg.nkey_seed_file
    tls = _tls_context(cfg)
    if tls is not None:
        opts["tls"] = tls
    wait = cfg.reconnect_wait_s
    while True:
        nc = NATS()
        try:
            await nc.connect(servers=servers or cfg.servers, **opts)
            return nc
        except (OSError, nats.errors.NoServersError, asyncio.TimeoutError, nats.errors.TimeoutError) as exc:
            log.warning("nats: cannot connect to %s (%s); retrying in %.1fs", servers or cfg.servers, exc, wait)
            await asyncio.sleep(wait)
            wait = min(wait * 2, cfg.max_reconnect_wait_s)


async def flush(nc: NATS, timeout: float = 10.0) -> None:
    """Return once the server has processed everything sent so far (subscriptions included).

    nats-py's `flush()` alone does not promise that: it writes its PING straight to the socket while
    SUB/PUB commands may still sit in the client's pending buffer for the flusher task, so the PONG can
    come back before a just-made subscription reaches the server. A request from another connection
    right after then gets "no responders" (9 in 300 tries on a quiet machine, nats-py 2.16). So wait
    until the flusher has written the buffer, then PING."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while nc.pending_data_size and nc.is_connected and loop.time() < deadline:
        await asyncio.sleep(0.001)
    await nc.flush(timeout=max(0.5, deadline - loop.time()))


# --- streams --------------------------------------------------------------------------------------


def stream_configs(cfg: StreamsConfig) -> list[api.StreamConfig]:
    """The four streams of docs/protocol.md with retention and limits from config."""
    storage = api.StorageType.FILE if cfg.storage == "file" else api.StorageType.MEMORY
    common = dict(storage=storage, num_replicas=cfg.replicas, duplicate_window=cfg.duplicate_window_s,
                  max_msg_size=cfg.max_msg_size)
    return [
        api.StreamConfig(name=subjects.PROMPTS_STREAM, subjects=subjects.STREAM_SUBJECTS[subjects.PROMPTS_STREAM],
                         retention=api.RetentionPolicy.WORK_QUEUE, **common),
        api.StreamConfig(name=subjects.TRAJECTORIES_STREAM,
                         subjects=subjects.STREAM_SUBJECTS[subjects.TRAJECTORIES_STREAM],
                         retention=api.RetentionPolicy.LIMITS, max_age=cfg.trajectories_max_age_s, **common),
        api.StreamConfig(name=subjects.EVENTS_STREAM, subjects=subjects.STREAM_SUBJECTS[subjects.EVENTS_STREAM],
                         retention=api.RetentionPolicy.LIMITS, max_msgs=cfg.events_max_msgs,
                         max_age=cfg.events_max_age_s, discard=api.DiscardPolicy.OLD, **common),
        api.StreamConfig(name=subjects.DLQ_STREAM, subjects=subjects.STREAM_SUBJECTS[subjects.DLQ_STREAM],
                         retention=api.RetentionPolicy.LIMITS, max_age=cfg.dlq_max_age_s, **common),
    ]


def _differs(want: api.StreamConfig, have: api.StreamConfig) -> bool:
    for f in ("subjects", "retention", "storage", "num_replicas", "duplicate_window", "max_msg_size", "max_age",
              "max_msgs", "discard"):
        w, h = getattr(want, f), getattr(have, f)
        if w is None:
            continue
        if isinstance(w, float) or isinstance(h, float):
            if abs(float(w or 0) - float(h or 0)) > 1e-6:
                return True
        elif w != h:
            return True
    return False


async def ensure_streams(js: JetStreamContext, cfg: StreamsConfig) -> dict[str, str]:
    """Create the streams and the weights KV bucket, or update them to match config. Idempotent.

    Returns {stream name: "created" | "updated" | "unchanged"}.
    """
    result: dict[str, str] = {}
    for want in stream_configs(cfg):
        try:
            info = await js.stream_info(want.name)
        except NotFoundError:
            await js.add_stream(want)
            result[want.name] = "created"
            continue
        if _differs(want, info.config):
            if want.retention != info.config.retention:
                raise ValueError(
                    f"stream {want.name} exists with retention {info.config.retention}, config wants "
                    f"{want.retention}: JetStream cannot change retention; delete the stream first"
                )
            await js.update_stream(want)
            result[want.name] = "updated"
        else:
            result[want.name] = "unchanged"
    await ensure_weights_kv(js, cfg)
    return result


async def ensure_weights_kv(js: JetStreamContext, cfg: StreamsConfig):
    storage = api.StorageType.FILE if cfg.storage == "file" else api.StorageType.MEMORY
    try:
        return await js.key_value(subjects.WEIGHTS_KV_BUCKET)
    except (NotFoundError, nats.js.errors.BucketNotFoundError):
        return await js.create_key_value(
            api.KeyValueConfig(bucket=subjects.WEIGHTS_KV_BUCKET, history=16, storage=storage,
                               replicas=cfg.replicas)
        )


# --- publish --------------------------------------------------------------------------------------


def header_bytes(headers: dict[str, str] | None) -> int:
    """Size of NATS message headers on the wire (`NATS/1.0` line, `Key: value` lines, blank line): the
    server counts them with the payload against max_payload."""
    if not headers:
        return 0
    return len(b"NATS/1.0\r\n") + sum(len(f"{k}: {v}\r\n".encode()) for k, v in headers.items()) + 2


def encode_checked(nc: NATS, msg: Any, subject: str = "", headers: dict[str, str] | None = None) -> bytes:
    """Encode `msg`, failing with MessageTooLarge (both sizes named) if the server would refuse it,
    headers included. (A message over max_payload makes the server close the connection, and nats-py
    does not reconnect after that: every consumer on it would be locked out.)"""
    data = codec.encode(msg)
    limit = nc.max_payload
    size = len(data) + header_bytes(headers)
    if limit and size > limit:
        raise codec.MessageTooLarge(msg.SCHEMA, size, limit, subject)
    return data


async def publish(js: JetStreamContext, nc: NATS, subject: str, msg: Any, msg_id: str | None = None,
                  timeout: float = 10.0) -> api.PubAck:
    """Publish one message to JetStream and wait for the stream's ack (dedup by `msg_id`)."""
    headers = {subjects.MSG_ID_HEADER: msg_id} if msg_id else None
    data = encode_checked(nc, msg, subject, headers)
    return await js.publish(subject, data, timeout=timeout, headers=headers)


async def publish_async(js: JetStreamContext, nc: NATS, subject: str, msg: Any,
                        msg_id: str | None = None) -> asyncio.Future:
    """Send one message to JetStream without waiting for its ack; returns a future of the PubAck.

    In-flight publishes are bounded by the JetStream context (`publish_async_max_pending`, 4000 by
    default; this call waits for a slot). The future has no timeout of its own: await it with
    `asyncio.wait_for(fut, timeout)`, or await `js.publish_async_completed()`. Large messages fail
    here, before sending, with MessageTooLarge.
    """
    headers = {subjects.MSG_ID_HEADER: msg_id} if msg_id else None
    data = encode_checked(nc, msg, subject, headers)
    return await js.publish_async(subject, data, headers=headers)


class EventNotDelivered(RuntimeError):
    """An event that must reach the controller was not acknowledged before the service began to stop."""


class EventPublisher:
    """Publishes Events of one service to `jetrl.<run>.events.<service>`. `emit` never raises (telemetry is
    best-effort, the work it describes is already durable); `emit_acked` is for the few events the
    controller's ledger depends on (the trainer's "groups"), which must survive a NATS outage."""

    RETRY_S = (0.5, 10.0)  # emit_acked: first and longest pause between attempts

    def __init__(self, js: JetStreamContext, nc: NATS, run: str, service: str, instance: str = ""):
        self.js, self.nc, self.run, self.service, self.instance = js, nc, run, service, instance
        self.subject = subjects.events(run, service)

    async def emit(self, kind: str, data: dict | None = None, msg_id: str | None = None) -> None:
        ev = Event(run=self.run, service=self.service, kind=kind, data=data or {}, instance=self.instance)
        try:
            await publish(self.js, self.nc, self.subject, ev, msg_id=msg_id, timeout=5.0)
        except Exception as exc:
            log.warning("event %s not published: %s", kind, exc)

    async def emit_acked(self, kind: str, data: dict | None = None, stop: asyncio.Event | None = None) -> None:
        """Publish until JetStream acknowledges the event, with back-off; one Nats-Msg-Id for every attempt,
        so an attempt that was stored but whose ack was lost is not stored twice. Raises EventNotDelivered
        once `stop` is set (the caller must then not act as if the event was delivered)."""
        ev = Event(run=self.run, service=self.service, kind=kind, data=data or {}, instance=self.instance)
        msg_id = f"{self.service}:{kind}:{uuid.uuid4().hex}"
        delay = self.RETRY_S[0]
        while True:
            try:
                await publish(self.js, self.nc, self.subject, ev, msg_id=msg_id, timeout=5.0)
                return
            except codec.MessageTooLarge:
                raise
            except Exception as exc:
                if stop is not None and stop.is_set():
                    raise EventNotDelivered(f"event {kind} of run {self.run} not acknowledged by JetStream "
                                            f"before stopping: {type(exc).__name__}: {exc}") from exc
                log.warning("event %s not acknowledged (%s: %s); retrying in %.1fs", kind, type(exc).__name__, exc,
                            delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.RETRY_S[1])


# --- the durable consumer loop --------------------------------------------------------------------


class Transient(Exception):
    """A handler failure worth retrying later (nak with back-off), e.g. a dependency is down."""


class Reject(Exception):
    """The message itself is unacceptable (over a configured bound, wrong run): dead-letter it at once
    with this reason, no retries."""


class ConnectionClosed(RuntimeError):
    """The NATS connection is closed for good (nats-py does not reconnect after some server errors):
    the consumer cannot go on; the service should exit and be restarted."""


@dataclass
class ConsumerStats:
    handled: int = 0
    failed: int = 0
    dead_lettered: int = 0
    in_progress_acks: int = 0


Handler = Callable[[Any, Msg], Awaitable[None]]


class ConsumerLoop:
    """A durable pull consumer, fetched in batches, with concurrent handlers and DLQ on poison messages.

    `handler(decoded_message, raw_msg)`; return normally to ack. Stop with `stop()`; `run()` returns
    after in-flight handlers finish (their messages are acked or left for redelivery).
    """

    def __init__(
        self,
        js: JetStreamContext,
        nc: NATS,
        *,
        run: str,
        stream: str,
        subject: str,
        durable: str,
        handler: Handler,
        expect: type | tuple[type, ...] | None = None,
        source: str = "",
        batch: int = 16,
        max_in_flight: int = 16,
        ack_wait_s: float = 30.0,
        max_deliver: int = 5,
        nak_backoff_s: tuple[float, ...] = (0.5, 1.0, 2.0, 5.0, 10.0),
        fetch_timeout_s: float = 1.0,
        deliver_policy: api.DeliverPolicy = api.DeliverPolicy.ALL,
        opt_start_seq: int | None = None,
        can_fetch: Callable[[], bool] | None = None,
    ):
        self.js, self.nc = js, nc
        self.run_id, self.stream, self.subject, self.durable = run, stream, subject, durable
        self.handler, self.expect = handler, expect
        # The dead-letter subject's last token (subjects.dlq): checked now, not when the first poison message
        # arrives (a durable name with a long run id in it can exceed the 64-character token limit).
        self.source = subjects.check_token(source or durable, "dead-letter source")
        self.batch, self.max_in_flight = batch, max_in_flight
        self.ack_wait_s, self.max_deliver, self.nak_backoff_s = ack_wait_s, max_deliver, nak_backoff_s
        self.fetch_timeout_s = fetch_timeout_s
        self.deliver_policy, self.opt_start_seq = deliver_policy, opt_start_seq
        self.can_fetch = can_fetch  # back-pressure hook: fetch only while it returns True
        self.stats = ConsumerStats()
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self._slots = asyncio.Semaphore(max_in_flight)
        self._slot_freed = asyncio.Event()  # set when enough slots are free for a refill fetch
        self._refill = max(1, min(batch, max_in_flight) // 2)
        self._running: dict[int, list] = {}  # id(msg) -> [msg, time of start or last in-progress ack]
        self._sub = None

    def consumer_config(self) -> api.ConsumerConfig:
        return api.ConsumerConfig(
            durable_name=self.durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait_s,
            max_deliver=-1,  # counted by the loop itself, see the module docstring
            filter_subject=self.subject,
            deliver_policy=self.deliver_policy,
            opt_start_seq=self.opt_start_seq,
            max_ack_pending=max(1000, self.max_in_flight * 4),
        )

    async def _subscribe(self) -> None:
        self._sub = await self.js.pull_subscribe(
            self.subject, durable=self.durable, stream=self.stream, config=self.consumer_config()
        )

    def stop(self) -> None:
        self._stop.set()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def run(self) -> None:
        """Fetch and handle until `stop()`. Cancelling run() cancels its handlers too (their messages
        are neither acked nor nak'ed, so JetStream redelivers them after ack_wait)."""
        heartbeat = asyncio.create_task(self._heartbeats())
        try:
            await self._fetch_loop()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
        except asyncio.CancelledError:
            tasks = list(self._tasks)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            heartbeat.cancel()

    async def _fetch_loop(self) -> None:
        backoff = 0.1
        # Refill in batches: with few free slots and handlers still running, wait (<= 50 ms) for more
        # to free up, so quick handlers get one big fetch instead of a round trip per message.
        refill = self._refill
        clock = asyncio.get_running_loop().time
        short_since: float | None = None
        while not self._stop.is_set():
            if self.nc.is_closed:
                raise ConnectionClosed(f"consumer {self.durable}: the NATS connection is closed; restart the service")
            try:
                if self._sub is None:
                    await self._subscribe()
                free = self.max_in_flight - len(self._tasks)
                if free <= 0 or (self.can_fetch is not None and not self.can_fetch()):
                    await self._wait_for_slot()
                    continue
                if free < refill and self._tasks:
                    if short_since is None:
                        short_since = clock()
                    if clock() - short_since < 0.05:
                        await self._wait_for_slot()
                        continue
                short_since = None
                try:
                    msgs = await self._sub.fetch(min(self.batch, free), timeout=self.fetch_timeout_s)
                except (NatsTimeoutError, asyncio.TimeoutError):
                    continue
                backoff = 0.1
                for m in msgs:
                    await self._slots.acquire()
                    t = asyncio.create_task(self._handle(m))
                    self._tasks.add(t)
                    t.add_done_callback(self._done)
            except asyncio.CancelledError:
                raise
            except NotFoundError:
                log.warning("consumer %s on %s vanished; re-creating", self.durable, self.stream)
                self._sub = None
                await self._sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            except Exception as exc:  # connection trouble: nats-py reconnects by itself, we wait
                log.warning("consumer %s: fetch failed (%s: %s); retrying in %.1fs", self.durable,
                            type(exc).__name__, exc, backoff)
                if isinstance(exc, (BadRequestError,)):
                    self._sub = None
                await self._sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _sleep(self, s: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), s)

    async def _wait_for_slot(self) -> None:
        """Until enough handlers finished for a refill (an event set by _done), at most 50 ms."""
        self._slot_freed.clear()
        if self._tasks:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._slot_freed.wait(), 0.05)
            await asyncio.sleep(0)  # let handlers that finished alongside report back
        else:
            await self._sleep(0.05)

    def _done(self, t: asyncio.Task) -> None:
        self._tasks.discard(t)
        self._slots.release()
        if not self._tasks or self.max_in_flight - len(self._tasks) >= self._refill:
            self._slot_freed.set()
        if not t.cancelled() and t.exception() is not None:  # a bug in the loop itself; never silent
            log.error("consumer %s: handler task crashed", self.durable, exc_info=t.exception())

    async def _handle(self, m: Msg) -> None:
        md = m.metadata
        delivered = md.num_delivered if md else 1
        if delivered > self.max_deliver:
            await self.dead_letter(m, f"delivered {delivered} times without success (max_deliver="
                                      f"{self.max_deliver}); the last attempt did not finish (handler crashed or "
                                      f"timed out)")
            return
        try:
            obj = codec.decode(m.data, self.expect)
        except codec.DecodeError as exc:
            await self.dead_letter(m, f"decode error: {exc}")
            return
        key = id(m)
        self._running[key] = [m, asyncio.get_running_loop().time()]  # for _heartbeats
        try:
            await self.handler(obj, m)
        except asyncio.CancelledError:
            raise
        except Reject as exc:
            self.stats.failed += 1
            await self.dead_letter(m, f"rejected: {exc}")
            return
        except Exception as exc:
            self.stats.failed += 1
            if delivered >= self.max_deliver:
                await self.dead_letter(m, f"handler failed on delivery {delivered}/{self.max_deliver}: "
                                          f"{type(exc).__name__}: {exc}")
            else:
                delay = self.nak_backoff_s[min(delivered - 1, len(self.nak_backoff_s) - 1)]
                log.warning("consumer %s: %s on delivery %d, retry in %.1fs: %s", self.durable,
                            type(exc).__name__, delivered, delay, exc)
                with contextlib.suppress(Exception):
                    await m.nak(delay=delay)
            return
        finally:
            self._running.pop(key, None)
        try:
            # Fire-and-forget ack (no round trip per message). If it is lost (connection drop), the
            # message is redelivered after ack_wait: handlers are idempotent (at-least-once).
            await m.ack()
            self.stats.handled += 1
        except Exception as exc:
            log.warning("consumer %s: ack failed (%s); message will be redelivered", self.durable, exc)

    async def _heartbeats(self) -> None:
        """One task for all handlers: every handler running longer than ack_wait/3 gets an in-progress
        ack each ack_wait/3, so JetStream does not redeliver a message whose handler is still working."""
        period = max(self.ack_wait_s / 3, 0.05)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(period / 2)
            now = loop.time()
            for entry in list(self._running.values()):
                if now - entry[1] >= period:
                    entry[1] = now
                    with contextlib.suppress(Exception):
                        await entry[0].in_progress()
                        self.stats.in_progress_acks += 1

    async def dead_letter(self, m: Msg, reason: str) -> None:
        """Publish a DeadLetter for `m` (original bytes, subject, reason, headers, size and sha256) and
        terminate `m`. A dead letter that would not fit under the server's max_payload keeps everything but
        the original bytes (their size and sha256 stay): a poison message must never lock a consumer out."""
        md = m.metadata
        seq = md.sequence.stream if md else 0
        dl = DeadLetter(
            run=self.run_id, source=self.source, subject=m.subject, reason=reason[:4096], original=bytes(m.data),
            delivery_count=md.num_delivered if md else 1, stream=self.stream, stream_seq=seq,
            headers={str(k)[:256]: str(v)[:1024] for k, v in list((m.headers or {}).items())[:64]},
            original_size=len(m.data), original_sha256=hashlib.sha256(m.data).hexdigest(),
        )
        subject = subjects.dlq(self.run_id, self.source)
        msg_id = f"dlq:{self.stream}:{seq}" if seq else None
        try:
            try:
                await publish(self.js, self.nc, subject, dl, msg_id=msg_id)
            except codec.MessageTooLarge:
                dl.original = b""
                dl.reason += (f" (original payload of {len(m.data)} bytes not kept: the dead letter would exceed "
                              f"the server's max_payload; sha256 {dl.original_sha256})")
                await publish(self.js, self.nc, subject, dl, msg_id=msg_id)
        except Exception as exc:
            # Not dead-lettered: leave the message for redelivery rather than lose it.
            log.error("consumer %s: could not publish dead letter (%s); leaving message for redelivery",
                      self.durable, exc)
            with contextlib.suppress(Exception):
                await m.nak(delay=self.nak_backoff_s[-1])
            return
        self.stats.dead_lettered += 1
        log.warning("consumer %s: dead-lettered %s seq %d: %s", self.durable, m.subject, seq, reason[:500])
        with contextlib.suppress(Exception):
            await m.term()
