"""`jetrl reward check`: passes a conforming service and fails one that breaks the protocol."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import msgpack
import pytest
from nats.micro import add_service
from reward_fixtures import ROOT, replicas, run_config

from reward_service.check import KnownCase, load_cases, run_check
from shared.contract import codec, subjects
from shared.contract.messages import RewardRequest, RewardResult


@pytest.mark.parametrize("task", ["exact", "gsm8k", "maxdigit", "sort", "regex",
                                  pytest.param("math", marks=pytest.mark.slow),
                                  pytest.param("code", marks=pytest.mark.slow)])
async def test_the_python_service_passes_the_suite_for_every_builtin_task(nats_config, nc, task):
    cfg = run_config(nats_config, processes=2)
    async with replicas(cfg, 1, task):
        report = await run_check(nc, task, requests=10)
    failed = [(c.name, c.detail) for c in report.cases if not c.ok]
    assert failed == [], (task, failed)
    assert len(report.latencies_ms) == 10
    assert report.percentile(50) <= report.percentile(99)


async def test_a_service_that_breaks_the_protocol_fails_the_suite(nc):
    async def sloppy(msg):  # answers every request with "1.0" for one completion, and never an error
        await msg.respond(msgpack.packb({"schema": "RewardResult", "v": 1, "task": "exact", "rewards": [1.0]}))

    await nc.subscribe(subjects.reward("exact"), queue=subjects.REWARD_QUEUE_GROUP, cb=sloppy)
    report = await run_check(nc, "exact", requests=3)
    failed = {c.name for c in report.cases if not c.ok}
    assert not report.ok
    assert {"valid", "missing completions", "not msgpack", "wrong task for this subject"} <= failed


async def test_nothing_answering_fails_every_case_quickly(nc):
    report = await run_check(nc, "nobody-home", requests=1, timeout=2)
    assert not report.ok
    assert all("no service answers" in c.detail for c in report.cases if c.name not in ("latency run", "discovery"))
    assert "no NATS micro service named jetrl-reward" in report.cases[0].detail


async def micro_scorer(nc, task: str, score, queue_group: str | None = subjects.REWARD_QUEUE_GROUP):
    """A third-party style service: NATS micro, one endpoint, `score(request) -> RewardResult`."""
    kw = {"queue_group": queue_group} if queue_group else {}
    svc = await add_service(nc, name="jetrl-reward", version="0.0.1", **kw)

    async def handler(req):
        try:
            r = codec.decode(req.data, expect=RewardRequest)
        except codec.DecodeError as exc:
            await req.respond(codec.encode(RewardResult(task=task, rewards=[], error=str(exc))))
            return
        await req.respond(codec.encode(score(r)))

    await svc.add_endpoint(name=task, subject=subjects.reward(task), handler=handler, **kw)
    return svc


def checking(task: str):
    """Answers like the engine: refuses what the protocol says to refuse, else `fn(completion, reference)`."""
    def wrap(fn):
        def score(r: RewardRequest) -> RewardResult:
            n = len(r.completions)
            problem = (r.task != task and "wrong task") or (n > 4096 and "too many") or (
                r.completion_ids is not None and len(r.completion_ids) != n and "ids") or (
                r.timeout_s is not None and not r.timeout_s > 0 and "timeout_s")
            if problem:
                return RewardResult(task=r.task, rewards=[0.0] * n, request_id=r.request_id, error=problem)
            out = [fn(c, r.reference) for c in r.completions]
            return RewardResult(task=task, rewards=[x for x, _ in out], errors=[e for _, e in out],
                                metrics=[{} for _ in out], request_id=r.request_id)
        return score
    return wrap


KNOWN = [KnownCase(["yes", "no"], None, [1.0, 0.0]), KnownCase(["YES!"], None, [1.0])]


async def test_a_custom_task_is_checked_against_the_users_known_cases(nc):
    svc = await micro_scorer(nc, "yesno", checking("yesno")(lambda c, _ref: (float(c.lower().startswith("yes")), None)))
    try:
        report = await run_check(nc, "yesno", requests=2, known=KNOWN)
    finally:
        await svc.stop()
    failed = [(c.name, c.detail) for c in report.cases if not c.ok]
    assert failed == [] and report.ok
    names = [c.name for c in report.cases]
    assert names[:2] == ["discovery", "queue group"] and "known case 2" in names
    assert "version 0.0.1" in report.cases[0].detail


async def test_a_service_whose_every_score_is_an_error_fails(nc):
    svc = await micro_scorer(nc, "yesno", checking("yesno")(lambda c, _ref: (0.0, "scorer crashed")))
    try:
        report = await run_check(nc, "yesno", requests=1, known=KNOWN)
    finally:
        await svc.stop()
    failed = {c.name: c.detail for c in report.cases if not c.ok}
    assert not report.ok
    assert {"valid", "known case 1", "known case 2", "still answering"} <= set(failed)
    assert "scored with an error" in failed["valid"]


async def test_nats_micros_default_queue_group_q_fails_the_check(nc):
    svc = await micro_scorer(nc, "yesno", checking("yesno")(lambda c, _ref: (1.0, None)), queue_group=None)
    try:
        report = await run_check(nc, "yesno", requests=1, known=[KnownCase(["a"], None, [1.0])])
    finally:
        await svc.stop()
    q = next(c for c in report.cases if c.name == "queue group")
    assert not q.ok and "queue group q (NATS micro's default)" in q.detail


async def test_completion_ids_timeout_and_max_completions_are_checked(nc):
    def lax(r: RewardRequest) -> RewardResult:  # scores everything, refuses nothing
        n = len(r.completions)
        return RewardResult(task=r.task, rewards=[1.0] * n, errors=[None] * n, request_id=r.request_id)

    svc = await micro_scorer(nc, "yesno", lax)
    try:
        report = await run_check(nc, "yesno", requests=1, known=[KnownCase(["a", "b"], None, [1.0, 1.0])],
                                 max_completions=16)
    finally:
        await svc.stop()
    failed = {c.name for c in report.cases if not c.ok}
    assert {"completion_ids of the wrong length", "timeout_s 0", "over max_completions (16 + 1)"} <= failed
    assert "completion_ids" not in failed


def test_known_cases_file_errors_name_the_line(tmp_path):
    f = tmp_path / "cases.jsonl"
    f.write_text('{"completions": ["a"], "reference": "a", "rewards": [1]}\n{"completions": ["a", "b"], "rewards": [1]}\n')
    with pytest.raises(ValueError, match=r"cases.jsonl:2: rewards must be a list of 2 numbers"):
        load_cases(str(f))
    f.write_text('{"completions": ["a"], "reference": "a", "rewards": [1]}\n')
    assert load_cases(str(f)) == [KnownCase(["a"], "a", [1.0], {})]


async def test_cli_checks_a_server_given_on_the_command_line(nats_server, nats_config, tmp_path):
    cases = tmp_path / "exact.jsonl"
    cases.write_text('{"completions": ["hello", "bye"], "reference": "hello", "rewards": [1, 0]}\n')
    async with replicas(run_config(nats_config), 1, "exact"):
        p = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "launcher.cli", "reward", "check", "--task", "exact",
                             "--server", nats_server.url, "--cases", str(cases), "--requests", "2"],
            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "known case 1" in p.stdout and "PASS" in p.stdout
