"""Code execution: run a Python completion against test cases in a sandbox, decided outside it.

reference: a list of tests, or `{"tests": [...], "timeout_s": float}`. A test is either a string of
assert statements run after the program (sharing its globals; setup statements allowed before them),
e.g. `"assert add(2, 3) == 5"`, or an stdin/stdout case `{"input": "2 3\\n", "output": "5"}` (a fresh
sandbox per case, outputs compared after stripping). The program is the last ```python fenced block of
the completion, or the whole completion when it has none. reward = fraction of tests passed.

Expected values never enter the sandbox; the host decides (docs/reward.md, "Code sandbox"): for an io
case the host feeds the input, reads the program's stdout and compares; for an assert the host
evaluates the comparison itself (code_assert.py), asking one sandbox per completion for the values of
the subexpressions that touch program state, as plain data. The sandbox (shared/runtime/sandbox.py): uid 65534,
no network, no host files, its own pid namespace and cgroup, a size-limited tmpfs work dir, rlimits,
output read with a cap. The harness's audit hook is a second layer only. A run cut short by a limit or
a refused operation is scored with an `error` (and the tests passed before it).
"""

from __future__ import annotations

import json
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reward_service.scorers import Score, code_assert
from shared.runtime import sandbox

HARNESS = Path(__file__).with_name("sandbox_harness.py")
FENCE_RE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)


@dataclass
class SandboxLimits:
    wall_s: float = 5.0
    cpu_s: int = 4
    memory_mb: int = 512
    output_bytes: int = 1 << 20
    max_tests: int = 100
    pids: int = 64
    disk_mb: int = 64
    cgroups: str = "auto"
    cgroup_parent: str = ""


LIMITS = SandboxLimits()


def configure(cfg: Any) -> None:
    """Take the sandbox limits from RewardConfig.code (called by the engine and in pool workers)."""
    code = getattr(cfg, "code", None)
    if code is not None:
        LIMITS.wall_s = code.wall_s
        LIMITS.cpu_s = code.cpu_s
        LIMITS.memory_mb = code.memory_mb
        LIMITS.output_bytes = code.output_bytes
        LIMITS.max_tests = code.max_tests
        LIMITS.pids, LIMITS.disk_mb = code.pids, code.disk_mb
        LIMITS.cgroups, LIMITS.cgroup_parent = code.cgroups, code.cgroup_parent


def extract_program(completion: str) -> str:
    blocks = FENCE_RE.findall(completion)
    return blocks[-1] if blocks else completion


def parse_tests(reference: Any) -> tuple[list, float]:
    wall = LIMITS.wall_s
    if isinstance(reference, dict):
        if "timeout_s" in reference:
            t = reference["timeout_s"]
            if isinstance(t, bool) or not isinstance(t, (int, float)) or t <= 0:
                raise ValueError("reference.timeout_s must be a positive number")
            wall = min(float(t), LIMITS.wall_s)
        reference = reference.get("tests")
    if not isinstance(reference, list) or not reference:
        raise ValueError("reference must be a non-empty list of tests or {'tests': [...]}")
    if len(reference) > LIMITS.max_tests:
        raise ValueError(f"{len(reference)} tests is over the limit of {LIMITS.max_tests}")
    parsed: list = []
    for i, t in enumerate(reference):
        if isinstance(t, str):
            parsed.append(code_assert.parse(t, f"test {i}"))
        elif isinstance(t, dict):
            parsed.append({"input": str(t.get("input", "")), "output": str(t.get("output", ""))})
        else:
            raise ValueError(f"test {i} must be an assert statement (str) or {{'input', 'output'}}")
    return parsed, wall


_SIGNALS = {signal.SIGXCPU: "CPU time limit", signal.SIGXFSZ: "output limit", signal.SIGKILL: "killed",
            signal.SIGSEGV: "segmentation fault"}
HARNESS_INSIDE = "/jetrl/sandbox_harness.py"
_VIOLATION = "jetrl-violation: "


def _limits() -> sandbox.Limits:
    return sandbox.Limits(cpu_s=LIMITS.cpu_s, memory_mb=LIMITS.memory_mb, file_bytes=LIMITS.output_bytes,
                          nproc=LIMITS.pids, disk_mb=LIMITS.disk_mb, cgroups=LIMITS.cgroups,
                          cgroup_parent=LIMITS.cgroup_parent)


def _argv(mode: str) -> list[str]:
    return [sandbox.python_binary(), "-I", "-S", "-B", HARNESS_INSIDE, mode, str(LIMITS.output_bytes)]


def _stopped(out: sandbox.Outcome, wall_s: float) -> str | None:
    """Why a sandbox was cut short, or None when it ended by itself with 0."""
    rc = out.returncode
    if rc > 128 and (rc - 128) in _SIGNALS:
        rc = -(rc - 128)  # bwrap reports a signalled child as 128 + signal
    if out.timed_out:
        return f"sandbox: timed out after {wall_s:g}s"
    if out.truncated:
        return f"sandbox: output over {LIMITS.output_bytes} bytes (reward.code.output_bytes); the run was killed"
    if out.memory_limit:
        return f"sandbox: memory limit of {LIMITS.memory_mb} MiB for the whole sandbox reached (reward.code.memory_mb)"
    if rc < 0:
        return f"sandbox: {_SIGNALS.get(-rc, f'signal {-rc}')} (exit {rc})"
    return None


def _violations(stderr: bytes) -> list[str]:
    return [line[len(_VIOLATION):] for line in stderr.decode("utf-8", "replace").splitlines()
            if line.startswith(_VIOLATION)]


class _Run:
    """One completion's results: tests passed, first failure, the error that cut a run short, violations."""

    def __init__(self, n: int):
        self.n, self.passed, self.failures, self.violations = n, 0, [], []
        self.error: str | None = None
        self.syntax_error = False


def _io_test(program: str, test: dict, deadline: float, wall_s: float, res: _Run, session) -> None:
    s = session(_argv("io"), _limits(), max(0.05, deadline - time.monotonic()), output_cap=LIMITS.output_bytes,
                files={"solution.py": program.encode()}, ro_files={str(HARNESS): HARNESS_INSIDE})
    try:
        s.send(test["input"].encode())
        s.close_stdin()
        s.read_to_end()
    finally:
        out = s.finish(wait=True)
    res.violations += _violations(out.stderr)
    stopped = _stopped(out, wall_s)
    got = out.stdout.decode("utf-8", "replace")
    err = out.stderr.decode("utf-8", "replace")
    if stopped:
        res.error = res.error or stopped
    elif "jetrl-syntax-error: " in err:
        res.syntax_error = True
        res.failures.append("SyntaxError: " + err.split("jetrl-syntax-error: ", 1)[1].strip()[:300])
    elif out.returncode != 0:
        res.failures.append(err.strip()[-300:] or f"exit {out.returncode}")
    elif got.strip() == test["output"].strip():
        res.passed += 1
    else:
        res.failures.append(f"expected {test['output'][:100]!r}, got {got[:100]!r}")


class _Dead(code_assert.Abort):
    """The assert sandbox stopped answering (ended, killed, timed out, or garbled the protocol)."""


def _assert_tests(program: str, tests: list[list], deadline: float, wall_s: float, res: _Run, session) -> None:
    s = session(_argv("asserts"), _limits(), max(0.05, deadline - time.monotonic()), output_cap=LIMITS.output_bytes,
                ro_files={str(HARNESS): HARNESS_INSIDE})
    seq = 0

    def ask(op: str, src: str) -> dict:
        nonlocal seq
        seq += 1
        s.send(json.dumps({"seq": seq, "op": op, "src": src}).encode() + b"\n")
        line = s.readline()
        if line is None:
            raise _Dead("the harness stopped answering")
        head, _, body = line.partition(b" ")
        try:
            reply = json.loads(body) if head == str(seq).encode() else None
        except (ValueError, RecursionError):
            reply = None
        if not isinstance(reply, dict):
            raise _Dead("the sandbox's reply was garbled (the program wrote to the harness's channel)")
        v = reply.get("violations")
        if isinstance(v, list):
            res.violations += [str(x)[:300] for x in v if str(x) not in res.violations]
        return reply

    def leaf(src: str):
        reply = ask("eval", src)
        if "err" in reply:
            raise code_assert.TestFailed(str(reply["err"])[:500])
        value = code_assert.decode(reply.get("v"))
        seen.append(f"{src[:60]} = {repr(value)[:80]}")
        return value

    seen: list[str] = []  # the leaves of the current test, for its failure message

    dead: str | None = None
    try:
        loaded = ask("load", program)
        if "err" in loaded:
            res.syntax_error = bool(loaded.get("syntax"))
            res.failures.append(str(loaded["err"])[:500])
            return
        for steps in tests:
            seen.clear()
            try:
                for kind, what in steps:
                    if kind == "exec":
                        reply = ask("exec", what)
                        if "err" in reply:
                            raise code_assert.TestFailed(str(reply["err"])[:500])
                    elif not code_assert.evaluate(what, leaf):
                        got = f" ({'; '.join(seen[-3:])})" if seen else ""
                        raise code_assert.TestFailed(f"AssertionError: {code_assert.ast.unparse(what)[:200]}{got}")
                res.passed += 1
            except code_assert.TestFailed as exc:
                res.failures.append(str(exc))
    except _Dead as exc:
        dead = str(exc)
    finally:
        out = s.finish()
    res.violations += [v for v in _violations(out.stderr) if v not in res.violations]
    if dead is not None or out.timed_out or out.truncated or out.memory_limit:
        tail = out.stderr[-300:].decode(errors="replace")
        cut = _stopped(out, wall_s) if (out.timed_out or out.truncated or out.memory_limit) else None
        res.error = res.error or cut or (f"sandbox: {dead} (exit {out.returncode})" if dead else None) or (
            f"sandbox: harness exited with {out.returncode} before answering: {tail}")


def run_sandboxed(program: str, tests: list, wall_s: float, session=sandbox.Session) -> Score:
    """Score `program` against parsed `tests` (parse_tests): the assert tests in one sandbox, each io test in
    a fresh one, all within `wall_s`. `session` starts a sandbox (shared/runtime/sandbox.Session)."""
    t0 = time.monotonic()
    deadline = t0 + wall_s
    res = _Run(len(tests))
    asserts = [t for t in tests if isinstance(t, list)]
    if asserts:
        _assert_tests(program, asserts, deadline, wall_s, res, session)
    for t in tests:
        if isinstance(t, dict) and res.error is None and not res.syntax_error:
            _io_test(program, t, deadline, wall_s, res, session)
    metrics: dict = {"passed": res.passed, "tests": res.n, "elapsed_s": round(time.monotonic() - t0, 4)}
    if res.failures:
        metrics["first_failure"] = res.failures[0][:300]
    if res.syntax_error:
        metrics["syntax_error"] = True
    error = res.error or (f"sandbox: {res.violations[0]}" if res.violations else None)
    return Score(res.passed / res.n if res.n else 0.0, metrics, error)


def score(completion: str, reference: Any, payload: dict | None = None) -> Score:
    tests, wall = parse_tests(reference)
    return run_sandboxed(extract_program(completion), tests, wall)
