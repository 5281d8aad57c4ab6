"""The durable consumer loop every service consumes with, where the delivery guarantees live
(docs/protocol.md, "Ack rules"):
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
  never delivered again and silently stays in the stream (docs/protocol.md, "Ack rules").
- cancelling `run()` cancels its handlers (no ack: redelivered after ack_wait, like a crash); `stop()`
  lets them finish and returns after the current fetch (at most fetch_timeout_s).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError

from shared.contract import codec, subjects
from shared.contract.bus import publish
from shared.contract.messages import DeadLetter

log = logging.getLogger("jetrl.bus")


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
