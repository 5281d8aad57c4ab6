"""Code execution: run a Python completion against test cases in a sandboxed subprocess.

reference: a list of tests, or `{"tests": [...], "timeout_s": float}`. A test is either an assert
statement run after the program (sharing its globals), e.g. `"assert add(2, 3) == 5"`, or an
stdin/stdout case `{"input": "2 3\\n", "output": "5"}` (a fresh run of the program per case, outputs
compared after stripping). The program is the last ```python fenced block of the completion, or the
whole completion when it has none. reward = fraction of tests passed.

The sandbox (docs/reward.md): a fresh temp dir as cwd, `python -I -S -B` (no site-packages, no
PYTHON* env), an environment of PATH/LANG/HOME only (no inherited secrets), rlimits on CPU time,
address space, file size (caps stdout/stderr files), open files, processes (RLIMIT_NPROC; the kernel
does not apply it to root), its own session killed as a group on timeout, and an audit hook in the
harness refusing process creation, sockets, ctypes and file access outside the temp dir. A run cut
short by a limit or a refused operation is scored with an `error` (and the tests passed before it).
"""

from __future__ import annotations

import json
import os
import re
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reward_service.scorers import Score

HARNESS = Path(__file__).with_name("sandbox_harness.py")
FENCE_RE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)


@dataclass
class SandboxLimits:
    wall_s: float = 5.0
    cpu_s: int = 4
    memory_mb: int = 512
    output_bytes: int = 1 << 20
    max_tests: int = 100


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
    for i, t in enumerate(reference):
        if not isinstance(t, (str, dict)):
            raise ValueError(f"test {i} must be an assert statement (str) or {{'input', 'output'}}")
    return reference, wall


def _limits(cpu_s: int, memory_mb: int, output_bytes: int):
    def apply() -> None:  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        mem = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_FSIZE, (output_bytes, output_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NPROC, (64, 64))

    return apply


_SIGNALS = {signal.SIGXCPU: "CPU time limit", signal.SIGXFSZ: "output limit", signal.SIGKILL: "killed",
            signal.SIGSEGV: "segmentation fault"}


def run_sandboxed(program: str, tests: list, wall_s: float) -> Score:
    tmp = tempfile.mkdtemp(prefix="jetrl-code-")
    try:
        work = Path(tmp)
        (work / "solution.py").write_text(program, encoding="utf-8")
        (work / "tests.json").write_text(json.dumps({"tests": tests, "output_cap": LIMITS.output_bytes}))
        nonce = secrets.token_hex(16)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": tmp, "PYTHONHASHSEED": "0"}
        t0 = time.monotonic()
        with open(work / "stdout.txt", "wb") as out, open(work / "stderr.txt", "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", str(HARNESS)], cwd=tmp, env=env, stdin=subprocess.PIPE,
                stdout=out, stderr=err, start_new_session=True, close_fds=True,
                preexec_fn=_limits(LIMITS.cpu_s, LIMITS.memory_mb, LIMITS.output_bytes),
            )
            timed_out = False
            try:
                proc.stdin.write(nonce.encode() + b"\n")
                proc.stdin.close()
            except BrokenPipeError:
                pass
            try:
                proc.wait(timeout=wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                try:  # the whole session: a program's children die with it
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        elapsed = time.monotonic() - t0
        return _outcome(work, nonce, len(tests), proc.returncode, timed_out, wall_s, elapsed)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _outcome(work: Path, nonce: str, n: int, rc: int, timed_out: bool, wall_s: float, elapsed: float) -> Score:
    passed, failures, violations = 0, [], []
    prefix = nonce + " "
    try:
        lines = (work / "result.jsonl").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    seen = set()
    for line in lines:
        if not line.startswith(prefix):
            continue
        try:
            row = json.loads(line[len(prefix):])
        except ValueError:
            continue
        if row.get("i") in seen:
            continue
        seen.add(row.get("i"))
        if row.get("ok"):
            passed += 1
        elif row.get("error"):
            failures.append(row["error"])
        violations.extend(row.get("violations") or [])
    metrics = {"passed": passed, "tests": n, "elapsed_s": round(elapsed, 4)}
    if failures:
        metrics["first_failure"] = failures[0][:300]
    error = None
    if timed_out:
        error = f"sandbox: timed out after {wall_s:g}s"
    elif rc and rc < 0:
        error = f"sandbox: {_SIGNALS.get(-rc, f'signal {-rc}')} (exit {rc})"
    elif rc:
        tail = (work / "stderr.txt").read_bytes()[-300:].decode(errors="replace")
        error = f"sandbox: harness exited with {rc}: {tail}"
    elif violations:
        error = f"sandbox: {violations[0]}"
    elif any(f.startswith("SyntaxError") for f in failures) and passed == 0 and len(seen) == 1:
        metrics["syntax_error"] = True
    return Score(passed / n if n else 0.0, metrics, error)


def score(completion: str, reference: Any, payload: dict | None = None) -> Score:
    tests, wall = parse_tests(reference)
    return run_sandboxed(extract_program(completion), tests, wall)
