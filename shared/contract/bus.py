"""NATS plumbing every service uses: connect (TLS, credentials), flush, ensure and wait for streams and
the weights KV bucket, publish with a size check (one message or many in flight), and EventPublisher.
The durable consumer loop and its delivery guarantees are consumer.py."""

from __future__ import annotations

import asyncio
import logging
import ssl
import uuid
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from shared.config import NatsConfig, StreamsConfig
from shared.contract import codec, subjects
from shared.contract.messages import Event

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

    Returns {stream name: "created" | "updated" | "unchanged"}. With `cfg.manage` false (a service whose
    NATS user may only look streams up, shared/runtime/nats_permissions.py) it creates nothing: it waits until
    the controller made them, and returns {name: "exists"}.
    """
    if not cfg.manage:
        return await wait_for_streams(js)
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
    await ensure_sessions_kv(js, cfg)
    return result


async def wait_for_streams(js: JetStreamContext, poll_s: float = 0.5, warn_every_s: float = 10.0) -> dict[str, str]:
    """Wait until the four streams and the weights KV bucket exist (STREAM.INFO only: the least a service's
    NATS user is allowed); log which are missing every `warn_every_s`."""
    names = [*subjects.ALL_STREAMS, f"KV_{subjects.WEIGHTS_KV_BUCKET}", f"KV_{subjects.SESSIONS_KV_BUCKET}"]
    loop = asyncio.get_running_loop()
    start = last_warn = loop.time()
    missing = list(names)
    while True:
        still = []
        for name in missing:
            try:
                await js.stream_info(name)
            except NotFoundError:
                still.append(name)
        if not still:
            return {n: "exists" for n in subjects.ALL_STREAMS}
        missing = still
        if loop.time() - last_warn >= warn_every_s:
            last_warn = loop.time()
            log.warning("waiting %.0fs for %s to be created (by the controller: streams.manage is false here)",
                        last_warn - start, ", ".join(missing))
        await asyncio.sleep(poll_s)


async def _ensure_kv(js: JetStreamContext, cfg: StreamsConfig, bucket: str, **config):
    """The KV bucket `bucket`, created with `config` (and the streams' storage and replicas) if it is missing."""
    try:
        return await js.key_value(bucket)
    except (NotFoundError, nats.js.errors.BucketNotFoundError):
        storage = api.StorageType.FILE if cfg.storage == "file" else api.StorageType.MEMORY
        return await js.create_key_value(api.KeyValueConfig(bucket=bucket, storage=storage, replicas=cfg.replicas,
                                                            **config))


async def ensure_weights_kv(js: JetStreamContext, cfg: StreamsConfig):
    return await _ensure_kv(js, cfg, subjects.WEIGHTS_KV_BUCKET, history=16)


async def ensure_sessions_kv(js: JetStreamContext, cfg: StreamsConfig):
    """The online sessions' bucket (rollout_service/online/records.py): one value per key, kept at most
    streams.sessions_max_age_s (serve-policy deletes them sooner: online.session_ttl_s); direct gets by
    subject, so permissions scope them to a run's keys."""
    return await _ensure_kv(js, cfg, subjects.SESSIONS_KV_BUCKET, history=1, ttl=cfg.sessions_max_age_s,
                            max_value_size=cfg.max_msg_size, direct=True)


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
