"""GSM8K scores/s of one reward service process over NATS, against calling the scorer in-process.

    python bench/reward_throughput.py [--group 64] [--concurrency 8] [--seconds 8] [--rounds 8]

Completions are built from the GSM8K test split (tests/data/gsm8k): each request is one group of
`--group` completions of one problem (the worked solution ending in "#### n", "\\boxed{n}", "The answer
is n." or a wrong number). The service is a real `jetrl reward serve --task gsm8k` subprocess on an
embedded nats-server; the client keeps `--concurrency` requests in flight. In-process = the same
completions through reward_service.scorers.gsm8k.score in a loop. Last line: reward_service_ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reward_service.client import RewardClient  # noqa: E402
from reward_service.scorers import gsm8k  # noqa: E402
from shared import bus  # noqa: E402
from shared.config import NatsConfig, RewardConfig  # noqa: E402
from shared.natsd import EmbeddedNats  # noqa: E402

DATA = ROOT / "tests" / "data" / "gsm8k" / "test.jsonl"


def groups(size: int) -> list[tuple[list[str], str]]:
    out = []
    for line in DATA.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        sol, ans = row["answer"].rsplit("####", 1)
        ans = ans.strip()
        forms = [f"{sol}#### {ans}", f"{sol}So the answer is $\\boxed{{{ans}}}$.", f"{sol}The answer is {ans}.",
                 f"{sol}The answer is {ans}1."]
        out.append(([forms[i % len(forms)] for i in range(size)], row["answer"]))
    return out


def in_process(work: list[tuple[list[str], str]], seconds: float, start: int) -> tuple[int, float]:
    n, i, t0 = 0, start, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        comps, ref = work[i % len(work)]
        for c in comps:
            gsm8k.score(c, ref, {})
        n += len(comps)
        i += 1
    return n, time.perf_counter() - t0


async def over_nats(client: RewardClient, work: list[tuple[list[str], str]], seconds: float, concurrency: int,
                    start: int) -> tuple[int, float, int]:
    done, errors = 0, 0
    stop_at = time.perf_counter() + seconds

    async def loop(k: int) -> None:
        nonlocal done, errors
        i = start + k
        while time.perf_counter() < stop_at:
            comps, ref = work[i % len(work)]
            r = await client.score("gsm8k", comps, ref)
            errors += 1 if r.error else 0
            done += len(r.rewards)
            i += concurrency

    t0 = time.perf_counter()
    await asyncio.gather(*(loop(k) for k in range(concurrency)))
    return done, time.perf_counter() - t0, errors


async def measure(url: str, work: list[tuple[list[str], str]], seconds: float, rounds: int,
                  concurrency: int) -> tuple[float, float, int]:
    """Alternate in-process and over-NATS rounds, so a change in machine load hits both alike."""
    nc = await bus.connect(NatsConfig(servers=[url]), name="bench")
    client = RewardClient(nc, RewardConfig(timeout_s=30, retries=20, retry_backoff_s=0.2))
    warm = await client.score("gsm8k", work[0][0], work[0][1])  # waits (retries) until the service is up
    assert warm.error is None, warm.error
    local = [0, 0.0]
    remote = [0, 0.0]
    errors = 0
    for r in range(rounds):
        n, t = in_process(work, seconds / rounds, r * 97)
        local[0] += n
        local[1] += t
        n, t, e = await over_nats(client, work, seconds / rounds, concurrency, r * 97)
        remote[0] += n
        remote[1] += t
        errors += e
    await nc.close()
    return local[0] / local[1], remote[0] / remote[1], errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--group", type=int, default=64, help="completions per request")
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    ap.add_argument("--seconds", type=float, default=8.0, help="total duration of each measurement")
    ap.add_argument("--rounds", type=int, default=8, help="alternating rounds the time is split into")
    args = ap.parse_args()
    work = groups(args.group)
    with EmbeddedNats() as srv:
        log = open(os.devnull, "wb")
        proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "reward", "serve", "--task", "gsm8k",
                                 f"nats.servers=[{srv.url}]", "telemetry.metrics_port=-1",
                                 "telemetry.log_level=WARNING"], cwd=ROOT, stdout=log, stderr=log)
        try:
            local, remote, errors = asyncio.run(measure(srv.url, work, args.seconds, args.rounds, args.concurrency))
        finally:
            proc.terminate()
            proc.wait(15)
    print(f"cpus: {os.cpu_count()}  load average: {os.getloadavg()[0]:.1f}  group: {args.group}  "
          f"concurrency: {args.concurrency}  seconds: {args.seconds:g} each, in {args.rounds} alternating rounds")
    if errors:
        print(f"warning: {errors} requests came back with an error")
    print(f"in-process gsm8k scorer: {local:,.0f} scores/s")
    print(f"one service process over NATS: {remote:,.0f} scores/s")
    print(f"reward_service_ratio: {remote / local:.3f}")


if __name__ == "__main__":
    main()
