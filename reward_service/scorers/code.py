"""Code execution: run a Python completion against test cases in a sandboxed subprocess.

reference: a list of tests, or `{"tests": [...], "timeout_s": float}`. A test is either an assert
statement run after the program (sharing its globals), e.g. `"assert add(2, 3) == 5"`, or an
stdin/stdout case `{"input": "2 3\\n", "output": "5"}` (a fresh run of the program per case, outputs
compared after stripping). The program is the last ```python fenced block of the completion, or the
whole completion when it has none. reward = fraction of tests passed.

The boundary (docs/reward.md, "Code sandbox"): every completion runs in a fresh bubblewrap sandbox
(shared/sandbox.py): uid 65534, no network, no host files but a read-only interpreter and a private
work dir, its own pid namespace (every process of the run dies with it), rlimits on CPU time, address
space, file size, open files and processes, output read with a cap. `python -I -S -B` runs the harness,
whose audit hook (refusing process creation, sockets, ctypes and file access outside the work dir) is a
second layer only: code can switch it off, the sandbox still holds. A run cut short by a limit or a
refused operation is scored with an `error` (and the tests passed before it).
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reward_service.scorers import Score
from shared import sandbox

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


_SIGNALS = {signal.SIGXCPU: "CPU time limit", signal.SIGXFSZ: "output limit", signal.SIGKILL: "killed",
            signal.SIGSEGV: "segmentation fault"}
HARNESS_INSIDE = "/jetrl/sandbox_harness.py"


def run_sandboxed(program: str, tests: list, wall_s: float) -> Score:
    """One isolated run of the harness over `program` and `tests` in a fresh bubblewrap sandbox
    (shared/sandbox.py: no network, no host files, its own pid namespace, uid 65534, rlimits)."""
    tmp = tempfile.mkdtemp(prefix="jetrl-code-")
    try:
        work = Path(tmp)
        (work / "solution.py").write_text(program, encoding="utf-8")
        (work / "tests.json").write_text(json.dumps({"tests": tests, "output_cap": LIMITS.output_bytes}))
        sandbox.prepare_workdir(work)
        nonce = secrets.token_hex(16)
        limits = sandbox.Limits(cpu_s=LIMITS.cpu_s, memory_mb=LIMITS.memory_mb, file_bytes=LIMITS.output_bytes)
        out = sandbox.run([sandbox.python_binary(), "-I", "-S", "-B", HARNESS_INSIDE], work, limits, wall_s,
                          stdin=nonce.encode() + b"\n", output_cap=LIMITS.output_bytes,
                          ro_files={str(HARNESS): HARNESS_INSIDE})
        rc = out.returncode
        if rc > 128 and -(rc - 128) in [-s for s in _SIGNALS]:
            rc = -(rc - 128)  # bwrap reports a signalled child as 128 + signal
        score = _outcome(work, nonce, len(tests), rc, out.timed_out, wall_s, out.elapsed_s, out.stderr)
        if out.truncated and not out.timed_out:
            score.error = f"sandbox: output over {LIMITS.output_bytes} bytes (reward.code.output_bytes); the run was killed"
        return score
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _outcome(work: Path, nonce: str, n: int, rc: int, timed_out: bool, wall_s: float, elapsed: float,
             stderr: bytes = b"") -> Score:
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
        tail = stderr[-300:].decode(errors="replace")
        error = f"sandbox: harness exited with {rc}: {tail}"
    elif violations:
        error = f"sandbox: {violations[0]}"
    elif any(f.startswith("SyntaxError") for f in failures) and passed == 0 and len(seen) == 1:
        metrics["syntax_error"] = True
    return Score(passed / n if n else 0.0, metrics, error)


def score(completion: str, reference: Any, payload: dict | None = None) -> Score:
    tests, wall = parse_tests(reference)
    return run_sandboxed(extract_program(completion), tests, wall)
