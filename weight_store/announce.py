"""Weight announcements: the KV bucket `jetrl_weights`, key `<run>` = the newest committed WeightVersion.

    rev = await announce(js, wv)           # compare-and-set on the key's revision
    wv = await latest(js, run)             # or None
    async for wv in watch(js, run): ...    # the latest first, then every later version in order

Two publishers of the same version cannot both succeed: `announce` writes with the revision it
read, so the second one's write fails and, seeing the version taken, raises VersionConflict.
Announcing what the key already holds (same version, same non-empty manifest sha256: a retry whose
reply was lost) is a no-op that returns the key's revision. Every publisher announces through
weight_store.client.publish_and_announce (commit, then this): WeightStoreClient.publish_version (upload
+ commit + announce) and the trainer's directory publisher.
`watch` yields every write of the key in KV order (a forged announcement too: readers check each with
weight_store.verify before acting on it) and survives a NATS disconnect or a server restart: on a silent gap (nothing for `idle_s`) it
re-reads the key, and it catches up on missed versions from the key's history (16 entries).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import nats
from nats.js import JetStreamContext
from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError

from shared.contract import codec
from shared.contract.messages import WeightVersion
from shared.contract.subjects import WEIGHTS_KV_BUCKET, check_run_id

log = logging.getLogger("jetrl.weights.announce")
_DELETES = ("DEL", "PURGE")


RefusalFn = Callable[[WeightVersion], Awaitable["str | None"]]
ForgedFn = Callable[[WeightVersion, str], Awaitable[None]]


class VersionConflict(Exception):
    """The run already has this version or a newer one announced (another publisher won)."""

    def __init__(self, run: str, version: int, announced: int):
        super().__init__(f"run {run!r}: cannot announce version {version}, version {announced} is already announced")
        self.run, self.version, self.announced = run, version, announced


async def _entry(kv, run: str):
    try:
        return await kv.get(run)
    except (KeyNotFoundError, KeyDeletedError):
        return None


def _decode(value: bytes | None) -> WeightVersion | None:
    if not value:
        return None
    return codec.decode(value, expect=WeightVersion)


def same_announcement(have: WeightVersion, wv: WeightVersion) -> bool:
    """The same announcement: version and manifest digest (the manifest names the publishing instance)."""
    return bool(wv.sha256) and have.version == wv.version and have.sha256 == wv.sha256


async def announce(js: JetStreamContext, wv: WeightVersion, refusal: RefusalFn | None = None,
                   on_forged: ForgedFn | None = None) -> int:
    """Set the run's key to `wv` if it is newer than what is announced; returns the KV revision. If the
    key already holds exactly `wv` (an earlier attempt went through, only its reply was lost), returns
    that revision without writing. `refusal` (weight_store.verify.StoreCheck.refusal) tells a real
    announcement from a forged one: a newer announcement the store does not hold as announced is
    overwritten (and `on_forged(it, why)` told) instead of raising VersionConflict."""
    run = check_run_id(wv.run)
    kv = await js.key_value(WEIGHTS_KV_BUCKET)
    data = codec.encode(wv)
    while True:
        entry = await _entry(kv, run)
        current = _decode(entry.value) if entry is not None else None
        if current is not None and same_announcement(current, wv):
            return entry.revision
        if current is not None and current.version >= wv.version:
            why = await refusal(current) if refusal is not None else None
            if why is None:
                raise VersionConflict(run, wv.version, current.version)
            log.error("run %s: the announced version %d is not the store's (%s): announcing %d over it", run,
                      current.version, why, wv.version)
            if on_forged is not None:
                await on_forged(current, why)
        try:
            if entry is None:
                return await kv.create(run, data)
            return await kv.update(run, data, last=entry.revision)
        except KeyWrongLastSequenceError:
            continue  # someone wrote in between: re-read and decide again


async def latest(js: JetStreamContext, run: str) -> WeightVersion | None:
    kv = await js.key_value(WEIGHTS_KV_BUCKET)
    entry = await _entry(kv, check_run_id(run))
    return _decode(entry.value) if entry is not None and entry.operation not in _DELETES else None


async def watch(js: JetStreamContext, run: str, idle_s: float = 2.0,
                retry_s: float = 0.5) -> AsyncIterator[WeightVersion]:
    """Yield the run's latest announcement (once there is one), then every later write of the key in
    order (by KV revision, not by version: a lower version written after a forged higher one, the
    trainer overwriting it, still comes through). Whether to act on one is the reader's call
    (weight_store.verify: the store must hold it, versions only go up)."""
    run = check_run_id(run)
    last_rev = -1
    while True:
        watcher = None
        try:
            kv = await js.key_value(WEIGHTS_KV_BUCKET)
            # watching before reading the backlog: writes made while the caller holds a yielded value
            # wait in the subscription instead of being missed
            watcher = await kv.watch(run)
            if last_rev < 0:
                first = await _entry(kv, run)
                backlog = [first] if first is not None and first.operation not in _DELETES else []
            else:  # after a gap: every write we missed that the history still holds
                backlog = await _history_entries(kv, run)
            for e in backlog:
                if e.revision > last_rev:
                    last_rev = e.revision
                    if (wv := _decode(e.value)) is not None:
                        yield wv
            while True:
                try:
                    entry = await watcher.updates(timeout=idle_s)
                except nats.errors.TimeoutError:
                    # Quiet: make sure the subscription is alive (a server restart can end it silently).
                    cur = await _entry(kv, run)
                    if cur is not None and cur.revision > last_rev:
                        break  # missed something: catch up from history
                    continue
                if entry is None or entry.operation in _DELETES or entry.revision <= last_rev:
                    continue
                last_rev = entry.revision
                wv = _decode(entry.value)
                if wv is not None:
                    yield wv
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:  # disconnected, server restarting, bucket not reachable yet
            log.debug("weights watch %s: %s: %s; retrying", run, type(exc).__name__, exc)
            await asyncio.sleep(retry_s)
        finally:
            if watcher is not None:
                try:
                    await asyncio.wait_for(watcher.stop(), 1.0)
                except Exception:
                    pass


async def _history_entries(kv, run: str) -> list:
    try:
        entries = await kv.history(run)
    except NoKeysError:
        return []
    return sorted((e for e in entries if e.operation not in _DELETES and e.value), key=lambda e: e.revision)
