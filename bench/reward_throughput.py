"""GSM8K scores/s of one reward service process over NATS, against calling the scorer in-process.

    python bench/reward_throughput.py [--group 64] [--concurrency 8] [--seconds 8] [--rounds 8]

Completions are built from the GSM8K test split (tests/data/gsm8k): each request is one group of
`--group` completions of one problem (the worked solution ending in "#### n", "\\boxed{n}", "The answer
is n." or a wrong number). The service is a real `jetrl reward serve --task gsm8k` subprocess on an
embedded nats-server; the client keeps `--concurrency` requests in flight. In-process = the same
completions through reward_service.scorers.gsm8k.score in a loop.

Then the `code` scorer (--code-seconds, 0 = skip): scores/s of programs run inside the bubblewrap
sandbox (shared/runtime/sandbox.py: one fresh sandbox for a completion's assert tests and one per io test, each
with its own cgroup and tmpfs where the host has them) against a plain subprocess with the same rlimits
and its own session (`PlainSession` below, the boundary the code scorer had before the sandbox), both over
the same harness, protocol and programs, `--code-threads` scores at once, in alternating rounds.
Last lines: reward_service_ratio, then sandbox_overhead_ratio (new / old scores per second).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reward_service.client import RewardClient  # noqa: E402
from reward_service.scorers import gsm8k  # noqa: E402
from shared.config import NatsConfig, RewardConfig  # noqa: E402
from shared.contract import bus  # noqa: E402
from shared.runtime import sandbox  # noqa: E402
from shared.runtime.natsd import EmbeddedNats  # noqa: E402

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


CODE_PROGRAM = "def add(a, b):\n    return a + b\n\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
CODE_TESTS = ["assert add(2, 3) == 5", "assert fib(15) == 610", {"input": "", "output": ""}]


class PlainSession(sandbox.Session):
    """The baseline: the same harness and protocol in a plain subprocess with the same rlimits, its own
    session killed as a group, files in a temp dir (no bwrap, no cgroup, no tmpfs). Measuring only."""

    def __init__(self, argv, limits, timeout_s, *, output_cap=1 << 20, files=None, work=None, ro_files=None,
                 ro_dirs=None):
        from reward_service.scorers import code

        self.t0 = time.monotonic()
        self.deadline = self.t0 + timeout_s
        self.output_cap = output_cap
        self.timed_out = self.truncated = False
        self.cgroup = None
        self.tmp = tempfile.mkdtemp(prefix="jetrl-code-plain-")
        for name, data in (files or {}).items():
            Path(self.tmp, name).write_bytes(data)
        argv = [str(code.HARNESS) if a == code.HARNESS_INSIDE else a for a in argv]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": self.tmp, "PYTHONHASHSEED": "0"}
        self.proc = subprocess.Popen(argv, cwd=self.tmp, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
                                     preexec_fn=sandbox.rlimits(limits))
        self._attach()

    def finish(self, wait=False):
        try:
            return super().finish(wait)
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)


def old_subprocess_score(program: str, tests: list, wall_s: float = 4.0):
    """The same scorer over PlainSession instead of the bubblewrap sandbox."""
    from reward_service.scorers import code

    return code.run_sandboxed(program, tests, wall_s, session=PlainSession)


def code_rate(score_fn, tests: list, seconds: float, threads: int) -> tuple[int, float]:
    """Scores per second of `score_fn(program, tests)` with `threads` running at once (as the reward
    service's thread executor runs the code scorer)."""
    from concurrent.futures import ThreadPoolExecutor

    stop_at = time.perf_counter() + seconds
    counts = [0] * threads

    def loop(k: int) -> None:
        while time.perf_counter() < stop_at:
            s = score_fn(CODE_PROGRAM, tests)
            assert s.reward == 1.0 and s.error is None, s
            counts[k] += 1

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(loop, range(threads)))
    return sum(counts), time.perf_counter() - t0


def measure_code(seconds: float, rounds: int, threads: int) -> tuple[float, float]:
    from reward_service.scorers import code

    def new(program, tests):
        return code.run_sandboxed(program, tests, 4.0)

    tests, _ = code.parse_tests(CODE_TESTS)

    new_n = old_n = 0
    new_t = old_t = 0.0
    for _ in range(rounds):
        n, t = code_rate(new, tests, seconds / rounds, threads)
        new_n, new_t = new_n + n, new_t + t
        n, t = code_rate(old_subprocess_score, tests, seconds / rounds, threads)
        old_n, old_t = old_n + n, old_t + t
    return new_n / new_t, old_n / old_t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--group", type=int, default=64, help="completions per request")
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    ap.add_argument("--seconds", type=float, default=8.0, help="total duration of each measurement")
    ap.add_argument("--rounds", type=int, default=8, help="alternating rounds the time is split into")
    ap.add_argument("--code-seconds", type=float, default=20.0, help="duration of each code measurement (0 = skip)")
    ap.add_argument("--code-threads", type=int, default=2, help="code scores run at once")
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
    if args.code_seconds > 0:
        new, old = measure_code(args.code_seconds, args.rounds, args.code_threads)
        print(f"code scorer, {args.code_threads} at once: bubblewrap sandbox {new:,.1f} scores/s, "
              f"previous plain subprocess {old:,.1f} scores/s")
        print(f"sandbox_overhead_ratio: {new / old:.3f}")


if __name__ == "__main__":
    main()
