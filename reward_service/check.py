"""`jetrl reward check --task NAME`: a conformance suite for any implementation of the reward protocol.

First discovery: a NATS micro service named `jetrl-reward` must list an endpoint on
`jetrl.reward.<task>` in queue group `jetrl-reward` (`$SRV.INFO.jetrl-reward`; NATS micro's default
queue group is `q`, and replicas in different groups would all score every request). Then it sends fixed
requests to whatever answers `jetrl.reward.<task>` (valid groups, unicode, an empty completion, an empty
group, `completion_ids`, `timeout_s`, more than `max_completions`, missing fields, wrong types, garbage
bytes, a wrong schema / version / task, a 1 MB completion), checks each reply against docs/protocol.md
(always a RewardResult; one reward per completion; no per-completion error on a valid request; `error`
set for an unusable request; the request id echoed; known answers for the built-in tasks and for the
user's `--cases FILE`), then times valid requests for latency percentiles.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import nats.errors
import numpy as np
from nats.aio.client import Client as NATS

from shared.contract import codec, subjects
from shared.contract.messages import RewardResult
from shared.io.jsonl import json_objects

SERVICE_NAME = "jetrl-reward"  # the NATS micro service name every replica registers (docs/reward.md)

# task -> (completions, reference, expected rewards) of the "valid" case.
SAMPLES: dict[str, tuple[list[str], Any, list[float]]] = {
    "exact": (["hello", "  hello\n", "goodbye"], "hello", [1.0, 1.0, 0.0]),
    "gsm8k": (["so #### 42", "The answer is 41."], "#### 42", [1.0, 0.0]),
    "maxdigit": ([" 8", "3"], "8", [1.0, 0.0]),
    "sort": (["012358", "012999", ""], "012358", [1.0, 0.5, 0.0]),
    "math": (["$\\boxed{\\frac{1}{2}}$", "$3$"], "0.5", [1.0, 0.0]),
    "regex": (["abc123", "xyz"], "\\d+", [1.0, 0.0]),
    "code": (["def f(x):\n    return x + 1\n", "def f(x):\n    return x\n"], ["assert f(1) == 2"], [1.0, 0.0]),
}
UNICODE = "café ☕ 日本語 مرحبا 🎉 \u200b"
GENERIC = (["a", "b"], "a", None)


@dataclass
class CaseResult:
    name: str
    ok: bool
    detail: str = ""
    latency_ms: float = 0.0


@dataclass
class CheckReport:
    task: str
    cases: list[CaseResult] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.cases) and all(c.ok for c in self.cases)

    def percentile(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        xs = sorted(self.latencies_ms)
        return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


def _req(task: str, completions: Any, reference: Any = None, **kw: Any) -> dict:
    out = {"schema": "RewardRequest", "v": 1, "task": task, "completions": completions, "reference": reference,
           "payload": {}, "request_id": kw.pop("request_id", "check")}
    out.update(kw)
    return out


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


Expect = Callable[[RewardResult], str | None]


def _shape(n: int, rid: str | None = None, rewards: list[float] | None = None, clean: bool = False) -> Expect:
    """A well-formed answer for n completions; `clean`: no completion may have an error (a valid request
    whose every score is an error is a broken scorer, not a conforming one)."""
    def check(r: RewardResult) -> str | None:
        if r.error:
            return f"unexpected error: {r.error}"
        if len(r.rewards) != n:
            return f"{len(r.rewards)} rewards for {n} completions"
        if len(r.errors) not in (0, n) or len(r.metrics) not in (0, n):
            return f"errors/metrics lists must have {n} entries"
        bad = [(i, e) for i, e in enumerate(r.errors) if e is not None]
        if clean and bad:
            return f"{len(bad)} of {n} completions of a valid request scored with an error, e.g. #{bad[0][0]}: {bad[0][1]}"
        if rid is not None and r.request_id != rid:
            return f"request_id {r.request_id!r} not echoed ({rid!r})"
        if rewards is not None and [round(x, 6) for x in r.rewards] != rewards:
            return f"rewards {r.rewards}, expected {rewards}"
        return None

    return check


def _refused(r: RewardResult) -> str | None:
    if not r.error:
        return "no `error` for an unusable request"
    if any(x != 0.0 for x in r.rewards):
        return f"rewards must be 0 when `error` is set, got {r.rewards}"
    return None


def _ids(*lists: list[int]) -> list[bytes]:
    """completion_ids on the wire: one packed little-endian int32 array (msgpack bin) per completion."""
    return [np.asarray(x, dtype="<i4").tobytes() for x in lists]


@dataclass
class KnownCase:
    completions: list[str]
    reference: Any
    rewards: list[float]
    payload: dict = field(default_factory=dict)


def load_cases(path: str) -> list[KnownCase]:
    """`--cases FILE`: JSON lines {"completions": [...], "reference": ..., "rewards": [...], "payload": {...}};
    ValueError naming the line and what to fix."""
    out = []
    for where, d in json_objects(path):
        comps, rewards = d.get("completions"), d.get("rewards")
        if not isinstance(comps, list) or not comps or not all(isinstance(c, str) for c in comps):
            raise ValueError(f"{where}: completions must be a non-empty list of strings")
        if (not isinstance(rewards, list) or len(rewards) != len(comps)
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in rewards)):
            raise ValueError(f"{where}: rewards must be a list of {len(comps)} numbers, one per completion")
        payload = d.get("payload", {})
        if not isinstance(payload, dict):
            raise ValueError(f"{where}: payload must be an object")
        out.append(KnownCase(comps, d.get("reference"), [float(x) for x in rewards], payload))
    if not out:
        raise ValueError(f"{path}: no cases (one JSON object per line)")
    return out


def cases(task: str, max_payload: int, known: list[KnownCase] | None = None,
          max_completions: int = 4096) -> list[tuple[str, bytes | None, Expect]]:
    comps, ref, expected = SAMPLES.get(task, GENERIC)
    if known:  # the user's first known case is the "valid" one
        comps, ref, expected = known[0].completions, known[0].reference, [round(x, 6) for x in known[0].rewards]
    uni_ref = UNICODE if task == "exact" else ref
    uni_expect = [1.0, 0.0] if task == "exact" else None
    big = "x" * (1 << 20)
    big_req = _pack(_req(task, [big], ref, request_id="big"))
    n = len(comps)
    out = [
        ("valid", _pack(_req(task, comps, ref, request_id="valid-1")), _shape(n, "valid-1", expected, clean=True)),
        ("valid group of 64", _pack(_req(task, (comps * 64)[:64], ref)), _shape(64, clean=True)),
        ("unicode", _pack(_req(task, [UNICODE, "cafe"], uni_ref, request_id="ü-1")), _shape(2, "ü-1", uni_expect)),
        ("empty completion", _pack(_req(task, [""], ref)), _shape(1, rewards=[0.0])),
        ("empty group", _pack(_req(task, [], ref)), _shape(0)),
        ("extra unknown field", _pack(_req(task, comps, ref, future_field={"a": 1})), _shape(n, clean=True)),
        ("completion_ids", _pack(_req(task, comps, ref, completion_ids=_ids(*[[7, i] for i in range(n)]))),
         _shape(n, rewards=expected, clean=True)),
        ("completion_ids of the wrong length", _pack(_req(task, comps, ref, completion_ids=_ids([1]) * (n + 1))),
         _refused),
        ("timeout_s 30 (the scorer's limit per completion)", _pack(_req(task, comps, ref, timeout_s=30.0)),
         _shape(n, rewards=expected, clean=True)),
        ("timeout_s 0", _pack(_req(task, comps, ref, timeout_s=0.0)), _refused),
        (f"over max_completions ({max_completions} + 1)", _pack(_req(task, [""] * (max_completions + 1), ref)),
         _refused),
        ("missing completions", _pack({k: v for k, v in _req(task, [], ref).items() if k != "completions"}),
         _refused),
        ("missing task", _pack({k: v for k, v in _req(task, comps, ref).items() if k != "task"}), _refused),
        ("missing schema", _pack({k: v for k, v in _req(task, comps, ref).items() if k != "schema"}), _refused),
        ("wrong type: completions is a string", _pack(_req(task, "hello", ref)), _refused),
        ("wrong type: completion is an int", _pack(_req(task, ["ok", 42], ref)), _refused),
        ("wrong type: payload is a list", _pack(_req(task, comps, ref, payload=[1])), _refused),
        ("wrong type: v is a string", _pack({**_req(task, comps, ref), "v": "1"}), _refused),
        ("not msgpack", b"\xc1\xc1 this is not msgpack", _refused),
        ("not a map", _pack([1, 2, 3]), _refused),
        ("wrong schema", _pack({**_req(task, comps, ref), "schema": "PromptTask"}), _refused),
        ("newer schema version", _pack({**_req(task, comps, ref), "v": 99}), _refused),
        ("wrong task for this subject", _pack(_req("not-" + task, comps, ref)), _refused),
        ("1 MB completion", big_req if len(big_req) <= max_payload else None, _shape(1, "big")),
        ("still answering", _pack(_req(task, comps, ref, request_id="valid-2")),
         _shape(n, "valid-2", expected, clean=True)),
    ]
    for i, k in enumerate(known or [], start=1):
        out.append((f"known case {i}", _pack(_req(task, k.completions, k.reference, payload=k.payload,
                                                  request_id=f"known-{i}")),
                    _shape(len(k.completions), f"known-{i}", [round(x, 6) for x in k.rewards], clean=True)))
    return out


async def discovery(nc: NATS, task: str, wait_s: float = 1.0) -> list[CaseResult]:
    """Ask `$SRV.INFO.jetrl-reward` who serves `jetrl.reward.<task>`: every replica must list that endpoint in
    queue group jetrl-reward."""
    subject = subjects.reward(task)
    inbox = nc.new_inbox()
    replies: list[dict] = []
    sub = await nc.subscribe(inbox)
    try:
        await nc.publish(f"$SRV.INFO.{SERVICE_NAME}", b"", reply=inbox)
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = await sub.next_msg(timeout=left)
            except nats.errors.TimeoutError:
                break
            try:
                d = json.loads(msg.data)
            except ValueError:
                continue
            if isinstance(d, dict):
                replies.append(d)
    finally:
        await sub.unsubscribe()
    eps = [(r, e) for r in replies for e in (r.get("endpoints") or []) if isinstance(e, dict) and e.get("subject") == subject]
    if not eps:
        names = sorted({str(r.get("name")) for r in replies})
        return [CaseResult("discovery", False, f"no NATS micro service named {SERVICE_NAME} lists an endpoint on "
                                               f"{subject} ($SRV.INFO.{SERVICE_NAME}; answered: {names or 'none'}): "
                                               "register one, docs/reward.md")]
    versions = sorted({str(r.get("version")) for r, _ in eps})
    out = [CaseResult("discovery", True, f"{len(eps)} replica(s), version {', '.join(versions)}, endpoint "
                                         f"{', '.join(sorted({str(e.get('name')) for _, e in eps}))}")]
    groups = sorted({str(e.get("queue_group", "(not reported)")) for _, e in eps})
    wrong = [g for g in groups if g != subjects.REWARD_QUEUE_GROUP]
    hint = " (NATS micro's default)" if "q" in wrong else ""
    out.append(CaseResult("queue group", not wrong,
                          f"queue group {', '.join(groups)}" + (f"{hint}: must be {subjects.REWARD_QUEUE_GROUP}, or "
                                                                "replicas in different groups all score every request"
                                                                if wrong else "")))
    return out


async def run_check(nc: NATS, task: str, requests: int = 200, timeout: float = 10.0,
                    known: list[KnownCase] | None = None, max_completions: int = 4096) -> CheckReport:
    subject = subjects.reward(task)
    report = CheckReport(task=task)
    report.cases += await discovery(nc, task)
    for name, data, expect in cases(task, nc.max_payload, known, max_completions):
        if data is None:
            report.cases.append(CaseResult(name, True, f"skipped: over the server's max_payload {nc.max_payload}"))
            continue
        t0 = time.perf_counter()
        try:
            msg = await nc.request(subject, data, timeout=timeout)
        except nats.errors.NoRespondersError:
            report.cases.append(CaseResult(name, False, f"no service answers on {subject}"))
            continue
        except nats.errors.TimeoutError:
            report.cases.append(CaseResult(name, False, f"no reply within {timeout:g}s"))
            continue
        ms = (time.perf_counter() - t0) * 1000
        try:
            result = codec.decode(msg.data, expect=RewardResult)
        except codec.DecodeError as exc:
            report.cases.append(CaseResult(name, False, f"reply is not a RewardResult: {exc}", ms))
            continue
        problem = expect(result)
        report.cases.append(CaseResult(name, problem is None, problem or (result.error or "ok")[:90], ms))
    comps, ref, _ = SAMPLES.get(task, GENERIC)
    if known:
        comps, ref = known[0].completions, known[0].reference
    data = _pack(_req(task, comps, ref))
    for _ in range(requests):
        t0 = time.perf_counter()
        try:
            await nc.request(subject, data, timeout=timeout)
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            report.cases.append(CaseResult("latency run", False, "a timed request got no reply"))
            break
        report.latencies_ms.append((time.perf_counter() - t0) * 1000)
    return report


def render(report: CheckReport) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"reward protocol conformance: jetrl.reward.{report.task}")
    table.add_column("case")
    table.add_column("result")
    table.add_column("ms", justify="right")
    table.add_column("detail", overflow="fold")
    for c in report.cases:
        table.add_row(c.name, "[green]pass[/]" if c.ok else "[red]FAIL[/]", f"{c.latency_ms:.1f}", c.detail)
    console = Console()
    console.print(table)
    if report.latencies_ms:
        console.print(f"latency over {len(report.latencies_ms)} valid requests: p50 {report.percentile(50):.2f} ms, "
                      f"p90 {report.percentile(90):.2f} ms, p99 {report.percentile(99):.2f} ms, "
                      f"max {max(report.latencies_ms):.2f} ms")
    passed = sum(c.ok for c in report.cases)
    console.print(f"{passed}/{len(report.cases)} cases passed: {'PASS' if report.ok else 'FAIL'}")


async def check_main(cfg: Any, task: str, requests: int, timeout: float, known: list[KnownCase] | None = None,
                     max_completions: int = 4096) -> bool:
    from rich.console import Console

    from shared.contract import bus

    try:
        nc = await asyncio.wait_for(bus.connect(cfg.nats, name="reward-check"), 3 * cfg.nats.connect_timeout_s)
    except asyncio.TimeoutError:
        Console(stderr=True).print(f"[red]cannot reach NATS at {', '.join(cfg.nats.servers)}[/] (nats.servers)")
        return False
    try:
        report = await run_check(nc, task, requests, timeout, known, max_completions)
    finally:
        await nc.close()
    render(report)
    return report.ok
