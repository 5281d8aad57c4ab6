"""Group commit for the bus follower: the events handlers hand over are written in one transaction.

At hundreds of rollout workers the events stream carries hundreds of events a second (each worker's
metrics and health, "published" batches, the trainer's steps). Written one transaction each, the
controller falls behind the bus (measured: trainer step events stored 18 s late at 256 workers, and
prompt release, which waits on the trainer's "groups" events, with them). `BatchWriter` collects what
the concurrent handlers submit while the previous write runs and commits it together; each handler
waits for the commit of its own item, so a message is still acked only after it is stored.

A batch that fails (a redelivered event among them: its stream sequence is stored already) is written
again one item at a time with `write_one`, so one duplicate costs one batch's retry and loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("jetrl.controller.batch")


class BatchWriter:
    """`await submit(item)` returns `write_one(item)`'s result, written in a batch by `write_many(items)`
    (in a worker thread; returns one result per item) of at most `max_batch` items."""

    def __init__(self, write_many: Callable[[list], list], write_one: Callable[[Any], Any], max_batch: int = 256):
        self.write_many, self.write_one, self.max_batch = write_many, write_one, max_batch
        self._queue: list[tuple[Any, asyncio.Future]] = []
        self._task: asyncio.Task | None = None
        self.batches = self.items = self.fallbacks = 0

    async def submit(self, item: Any) -> Any:
        fut = asyncio.get_running_loop().create_future()
        self._queue.append((item, fut))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        return await fut

    async def _run(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch:]
            live = [(it, f) for it, f in batch if not f.done()]  # a cancelled handler's item is left unwritten
            if not live:
                continue
            items = [it for it, _ in live]
            try:
                results = await asyncio.to_thread(self.write_many, items)
                self.batches += 1
                self.items += len(items)
            except Exception as exc:
                if len(items) > 1:
                    log.info("a batch of %d events failed (%s: %s); writing them one by one", len(items),
                             type(exc).__name__, exc)
                self.fallbacks += 1
                results = []
                for it in items:
                    try:
                        results.append(await asyncio.to_thread(self.write_one, it))
                    except Exception as one:
                        results.append(one)
            for (_, fut), res in zip(live, results, strict=True):
                if fut.done():
                    continue
                if isinstance(res, Exception):
                    fut.set_exception(res)
                else:
                    fut.set_result(res)
