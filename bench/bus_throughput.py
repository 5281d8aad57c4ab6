"""Bus throughput: jetrl's codec + publish_async + ConsumerLoop against raw nats-py on the same bytes.

Both sides publish N trajectory-sized messages (one 2,048-token sample with mask, logprobs and
versions: ~27 KB) to JetStream with async, acknowledged publishes (bounded in flight, Nats-Msg-Id set),
then consume them through a durable pull consumer with explicit acks:
- raw:   pre-encoded bytes, `js.publish_async`; `fetch(batch)` + `ack()` per message, no decoding;
- jetrl: `bus.publish_async` (encode + size check per message); `consumer.ConsumerLoop` with batch B and
         max_in_flight 2B, so the next fetch overlaps handling (decode, strict checks, handler, ack,
         in-progress heartbeats, DLQ on poison).
One run, one private EmbeddedNats in a temp dir. Last line: `bus_overhead_ratio: X` =
jetrl throughput / raw throughput (publish + consume wall time). Target >= 0.8.

    python bench/bus_throughput.py                 # 20,000 messages
    python bench/bus_throughput.py --messages 2000 # a quick run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time

import numpy as np

from shared.config import NatsConfig, StreamsConfig
from shared.contract import bus, codec, consumer, subjects
from shared.contract.messages import Sample, TrajectoryGroup
from shared.runtime.natsd import EmbeddedNats

TOKENS = 2048


def make_group(i: int) -> TrajectoryGroup:
    rng = np.random.default_rng(i)
    mask = np.ones(TOKENS, np.uint8)
    mask[:128] = 0
    s = Sample(tokens=rng.integers(0, 150_000, TOKENS, dtype=np.int32), loss_mask=mask,
               logprobs=(-rng.random(TOKENS, dtype=np.float32)) * mask,
               versions=np.where(mask == 1, 3, -1).astype(np.int32), prompt_len=128, reward=1.0,
               finish_reason="stop", timings={"generate": 1.25, "reward": 0.01})
    return TrajectoryGroup(run="bench", prompt_id=f"p{i}", epoch=0, samples=[s], worker="w0")


def codec_micro(group: TrajectoryGroup, n: int = 2000) -> tuple[float, float, int]:
    """µs per message of codec encode+decode, and of json with arrays as lists (what packing avoids)."""
    t0 = time.perf_counter()
    for _ in range(n):
        codec.decode(codec.encode(group), expect=TrajectoryGroup)
    ours = (time.perf_counter() - t0) / n * 1e6
    as_json = {k: v for k, v in codec.to_wire(group).items()}
    s = group.samples[0]
    as_json["samples"] = [{"tokens": s.tokens.tolist(), "loss_mask": s.loss_mask.tolist(),
                           "logprobs": s.logprobs.tolist(), "versions": s.versions.tolist(),
                           "prompt_len": s.prompt_len, "reward": s.reward, "timings": s.timings}]
    k = max(n // 10, 50)
    t0 = time.perf_counter()
    for _ in range(k):
        d = json.loads(json.dumps(as_json))
        np.asarray(d["samples"][0]["tokens"], np.int32)
        np.asarray(d["samples"][0]["logprobs"], np.float32)
    js_us = (time.perf_counter() - t0) / k * 1e6
    return ours, js_us, len(json.dumps(as_json))


async def raw_side(js, subject: str, durable: str, payloads: list[bytes], batch: int) -> tuple[float, float]:
    n = len(payloads)
    t0 = time.perf_counter()
    futs = [await js.publish_async(subject, p, headers={subjects.MSG_ID_HEADER: f"{durable}:{i}"})
            for i, p in enumerate(payloads)]
    await asyncio.wait_for(asyncio.gather(*futs), 300)
    t_pub = time.perf_counter() - t0
    sub = await js.pull_subscribe(subject, durable=durable, stream=subjects.TRAJECTORIES_STREAM)
    got = 0
    t0 = time.perf_counter()
    while got < n:
        try:
            msgs = await sub.fetch(min(batch, n - got), timeout=5)
        except asyncio.TimeoutError:
            continue
        for m in msgs:
            await m.ack()
        got += len(msgs)
    await js._nc.flush()
    t_sub = time.perf_counter() - t0
    await sub.unsubscribe()
    return t_pub, t_sub


async def jetrl_side(js, nc, subject: str, durable: str, groups: list[TrajectoryGroup],
                     batch: int) -> tuple[float, float]:
    n = len(groups)
    t0 = time.perf_counter()
    futs = [await bus.publish_async(js, nc, subject, g, msg_id=f"{durable}:{i}") for i, g in enumerate(groups)]
    await asyncio.wait_for(asyncio.gather(*futs), 300)
    t_pub = time.perf_counter() - t0
    done = asyncio.Event()
    count = 0

    async def handler(group: TrajectoryGroup, msg) -> None:
        nonlocal count
        count += 1
        if count == n:
            done.set()

    loop = consumer.ConsumerLoop(js, nc, run="bench", stream=subjects.TRAJECTORIES_STREAM, subject=subject,
                            durable=durable, handler=handler, expect=TrajectoryGroup, batch=batch,
                            max_in_flight=2 * batch, fetch_timeout_s=1)
    t0 = time.perf_counter()
    task = asyncio.create_task(loop.run())
    await asyncio.wait_for(done.wait(), 600)
    await nc.flush()  # the last acks are on the server
    t_sub = time.perf_counter() - t0
    loop.stop()  # returns after its current fetch times out; not part of the measurement
    await task
    return t_pub, t_sub


async def main(n: int, batch: int, rounds: int) -> None:
    groups = [make_group(i % 64) for i in range(n)]  # 64 distinct bodies, n distinct messages
    for i, g in enumerate(groups):
        groups[i] = TrajectoryGroup(run=g.run, prompt_id=f"p{i}", epoch=0, samples=g.samples, worker=g.worker)
    payloads = [codec.encode(g) for g in groups]
    size = statistics.mean(len(p) for p in payloads)
    ours_us, json_us, json_size = codec_micro(groups[0])
    with tempfile.TemporaryDirectory(prefix="jetrl-bench-") as tmp, EmbeddedNats(tmp) as srv:
        nc = await bus.connect(NatsConfig(servers=[srv.url]), name="bench")
        js = nc.jetstream(publish_async_max_pending=256)
        await bus.ensure_streams(js, StreamsConfig(max_msg_size=8 * 1024 * 1024))
        results: dict[str, list[tuple[float, float]]] = {"raw": [], "jetrl": []}
        for r in range(rounds):  # alternate, so background load hits both sides alike
            for side in ("raw", "jetrl") if r % 2 == 0 else ("jetrl", "raw"):
                subject = subjects.trajectories(f"bench{side}{r}")
                durable = f"bench-{side}-{r}"
                if side == "raw":
                    res = await raw_side(js, subject, durable, payloads, batch)
                else:
                    res = await jetrl_side(js, nc, subject, durable, groups, batch)
                results[side].append(res)
                await js.purge_stream(subjects.TRAJECTORIES_STREAM)
        await nc.close()

    def report(side: str) -> float:
        pub, sub = min(results[side], key=lambda x: x[0] + x[1])
        total = pub + sub
        print(f"{side:5s}: publish {n / pub:8.0f} msg/s {n * size / pub / 1e6:7.1f} MB/s | "
              f"consume {n / sub:8.0f} msg/s {n * size / sub / 1e6:7.1f} MB/s | "
              f"end-to-end {n / total:8.0f} msg/s {n * size / total / 1e6:7.1f} MB/s")
        return n / total

    print(f"messages: {n} x {size / 1024:.1f} KiB (one {TOKENS}-token sample; json would be "
          f"{json_size / 1024:.1f} KiB), batch {batch}, best of {rounds} round(s) per side")
    print(f"codec encode+decode: {ours_us:.1f} us/message (json with lists: {json_us:.0f} us, "
          f"{json_us / ours_us:.0f}x slower)")
    raw = report("raw")
    ours = report("jetrl")
    print(f"bus_overhead_ratio: {ours / raw:.3f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=20_000, help="messages per side and round")
    ap.add_argument("--batch", type=int, default=256, help="fetch batch (ConsumerLoop max_in_flight is twice this)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per side; the best is reported")
    args = ap.parse_args()
    asyncio.run(main(args.messages, args.batch, args.rounds))
