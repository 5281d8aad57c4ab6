"""python: runs model-written code in a bubblewrap sandbox (shared/runtime/sandbox.py).

Each call is a fresh sandbox: uid 65534, no network, none of the host's files but a read-only
interpreter and a private size-limited tmpfs work dir, its own pid namespace (every process the code starts
dies with the call) and cgroup (memory of the whole sandbox, pids.max; rlimits where the host has no cgroups),
rlimits on CPU seconds, address space, file size and open files, a wall-clock
limit, and stdout/stderr read up to a cap (the sandbox is killed past it). docs/workflows.md says what
the boundary is and is not.
"""

from __future__ import annotations

import signal
import sys

from rollout_service.tools.base import ToolError
from shared.runtime import sandbox


async def run_python(code: str, timeout_s: float, memory_mb: int = 256, cpu_s: int = 5,
                     output_bytes: int = 64 * 1024) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `code`, each output cut at `output_bytes` (the run is then killed and
    the text says so); ToolError on time-out (the whole sandbox is killed)."""
    # a fresh size-limited tmpfs work dir holding main.py, its own cgroup (memory for the whole sandbox,
    # pids.max) where the host has one; the environment's packages (numpy, sympy, ...) importable, read-only
    limits = sandbox.Limits(cpu_s=cpu_s, memory_mb=memory_mb, file_bytes=16 << 20)
    out = await sandbox.run_async([sys.executable, "-I", "-B", f"{sandbox.WORKDIR}/main.py"], None, limits, timeout_s,
                                  output_cap=output_bytes, ro_dirs=[sys.prefix], files={"main.py": code.encode()})
    if out.timed_out:
        raise ToolError(f"python: killed after {timeout_s:g} s (time limit)")
    stdout, stderr = out.stdout.decode("utf-8", "replace"), out.stderr.decode("utf-8", "replace")
    rc = out.returncode
    if rc > 128:
        rc = -(rc - 128)  # bwrap reports a signalled child as 128 + signal
    if out.truncated:
        stdout += f"\n... (output over {output_bytes} bytes: the program was stopped)"
    return rc, stdout, stderr


class PythonSandbox:
    name = "python"
    description = "Run a Python 3 program and return what it prints (stdout, then stderr)."
    parameters = {"type": "object", "properties": {"code": {"type": "string", "description": "Python source."}},
                  "required": ["code"]}

    def __init__(self, timeout_s: float = 5.0, memory_mb: int = 256, cpu_s: int = 5, output_bytes: int = 64 * 1024):
        self.timeout_s, self.memory_mb, self.cpu_s, self.output_bytes = timeout_s, memory_mb, cpu_s, output_bytes

    async def run(self, args: dict) -> str:
        rc, out, err = await run_python(str(args["code"]), self.timeout_s, self.memory_mb, self.cpu_s,
                                        self.output_bytes)
        text = out
        if err.strip():
            text += ("" if not text or text.endswith("\n") else "\n") + err
        if rc != 0:
            reason = {-signal.SIGXCPU: "CPU time limit", -signal.SIGKILL: "killed (memory, time or output limit)"}.get(
                rc, "")
            text = (text.rstrip() + "\n" if text.strip() else "") + f"(exit code {rc}{', ' + reason if reason else ''})"
        return text if text.strip() else "(no output)"
