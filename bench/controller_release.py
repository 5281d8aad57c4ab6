"""Controller release throughput: prompts/s from a 100k-row dataset into JetStream with the ledger in
SQLite and in PostgreSQL, against raw JetStream publishing (publish_async) of the same messages.

    python bench/controller_release.py [--rows 100000] [--no-pg]

The controller path includes everything a release does: admission check, PromptTask encoding, the
ledger rows + cursor committed before publishing, publish_async with Nats-Msg-Id, ack watermark.
The raw path publishes the same pre-encoded bytes with the same headers and waits for every ack.
Last line: `release_ratio_sqlite: X` (controller with SQLite / raw; target >= 0.5).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller import datasets as ds  # noqa: E402
from controller import store  # noqa: E402
from controller.release import prompt_id_for  # noqa: E402
from controller.service import Controller  # noqa: E402
from shared.config import JetrlConfig, NatsConfig  # noqa: E402
from shared.contract import bus, codec, subjects  # noqa: E402
from shared.contract.messages import PromptTask  # noqa: E402
from shared.runtime.natsd import EmbeddedNats  # noqa: E402


def make_rows(path: Path, n: int) -> None:
    import json

    rng = random.Random(0)
    with open(path, "w") as f:
        for i in range(n):
            d = [rng.randint(0, 9) for _ in range(5)]
            f.write(json.dumps({"prompt": "max " + " ".join(map(str, d)) + " =", "reference": str(max(d)), "id": i}) + "\n")


async def bench_controller(tmp: Path, nats_url: str, db_url: str, data: Path, run: str, n: int,
                           batch: int) -> float:
    cfg = JetrlConfig(run=run, nats=NatsConfig(servers=[nats_url]),
                      schedule={"max_staleness": 0, "batch_size": n},
                      controller={"db_url": db_url, "data_dir": str(tmp / f"data-{run}"), "release_batch": batch})
    ctl = Controller(cfg)
    await ctl.start()
    while not ctl.ready:
        await asyncio.sleep(0.01)
    norm = ds.normalize(ds.read_jsonl(data, 1 << 20), ds.FieldMapping(), ctl.data_dir / "datasets")
    d, _ = store.register_dataset(ctl.Session, norm, "maxdigit", "path", str(data), "jsonl")
    store.create_run(ctl.Session, cfg)
    ctl._activate(run)
    await asyncio.sleep(0.2)  # releaser idle, nothing enqueued yet
    t0 = time.perf_counter()
    store.enqueue(ctl.Session, run, str(d["id"]), 1, None, None)
    ctl.releasers[run].wake()
    rel = ctl.releasers[run]
    while True:
        published = await asyncio.to_thread(rel._published_seq)
        if published >= n:
            break
        await asyncio.sleep(0.005)
    dt = time.perf_counter() - t0
    await ctl.close()
    return n / dt


async def bench_raw(nats_url: str, data: Path, n: int, batch: int) -> float:
    nc = await bus.connect(NatsConfig(servers=[nats_url]), name="bench-raw")
    js = nc.jetstream()
    reader_dir = Path(tempfile.mkdtemp(prefix="jetrl-bench-"))
    norm = ds.normalize(ds.read_jsonl(data, 1 << 20), ds.FieldMapping(), reader_dir)
    reader = ds.DatasetReader(norm.path)
    run = "bench-raw"
    subject = subjects.prompts(run)
    msgs = []
    for i in range(n):
        pid = prompt_id_for(norm.content_hash, i)
        task = PromptTask(run=run, prompt_id=pid, epoch=0, payload=reader.payload(i), dataset="maxdigit",
                          group_size=4)
        msgs.append((subjects.group_id(run, 0, pid), codec.encode(task)))
    t0 = time.perf_counter()
    for i in range(0, n, batch):
        futs = [await js.publish_async(subject, data_, headers={subjects.MSG_ID_HEADER: gid})
                for gid, data_ in msgs[i : i + batch]]
        await asyncio.gather(*futs)
    dt = time.perf_counter() - t0
    reader.close()
    await nc.close()
    return n / dt


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--no-pg", action="store_true")
    ap.add_argument("--batch", type=int, default=0, help="controller.release_batch (0 = the default)")
    args = ap.parse_args()
    n = args.rows
    tmp = Path(tempfile.mkdtemp(prefix="jetrl-bench-release-"))
    nats = EmbeddedNats(tmp / "nats").start()
    nc = await bus.connect(NatsConfig(servers=[nats.url]), name="bench-setup")
    from shared.config import StreamsConfig

    await bus.ensure_streams(nc.jetstream(), StreamsConfig())
    await nc.close()
    data = tmp / "rows.jsonl"
    make_rows(data, n)
    batch = args.batch or JetrlConfig().controller.release_batch
    print(f"dataset: {n} rows; nats {nats.url}; release_batch {batch}")

    raw = await bench_raw(nats.url, data, n, batch)
    print(f"raw JetStream publish_async (batches of {batch}, pre-encoded): {raw:,.0f} prompts/s")
    sqlite = await bench_controller(tmp, nats.url, f"sqlite:///{tmp / 'ledger.db'}", data, "bench-sqlite", n, batch)
    print(f"controller release, ledger in SQLite:     {sqlite:,.0f} prompts/s ({sqlite / raw:.2f} of raw)")
    pg_ratio = None
    if not args.no_pg:
        from testkit.devpg import TempPostgres, find_pg_bin

        if find_pg_bin() is None:
            print("controller release, ledger in PostgreSQL: skipped (no initdb/pg_ctl)")
        else:
            pg = TempPostgres().start()
            try:
                url = pg.create_database("bench")
                pgr = await bench_controller(tmp, nats.url, url, data, "bench-pg", n, batch)
                pg_ratio = pgr / raw
                print(f"controller release, ledger in PostgreSQL: {pgr:,.0f} prompts/s ({pg_ratio:.2f} of raw)")
            finally:
                pg.stop()
    nats.close()
    if pg_ratio is not None:
        print(f"release_ratio_postgres: {pg_ratio:.2f}")
    print(f"release_ratio_sqlite: {sqlite / raw:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
