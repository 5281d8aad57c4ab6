"""python: runs model-written code in a separate, resource-limited Python process.

Limits: wall clock (killed with its whole process group), CPU seconds, address space, file size; an
isolated interpreter (`-I`: no user site, no PYTHON* env), an empty temp dir as cwd, no stdin, a minimal
environment. This bounds runaway code; it is not a security boundary against hostile code (no network
or filesystem namespace): run untrusted workloads in a container.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from pathlib import Path

from rollout_service.tools.base import ToolError


def _limits(memory_mb: int, cpu_s: int):
    def apply() -> None:  # runs in the child between fork and exec
        import resource

        mem = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024 * 1024, 16 * 1024 * 1024))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


async def run_python(code: str, timeout_s: float, memory_mb: int = 256, cpu_s: int = 5) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `code`; ToolError on time-out (the process group is killed)."""
    with tempfile.TemporaryDirectory(prefix="jetrl-py-") as tmp:
        script = Path(tmp) / "main.py"
        script.write_text(code)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", str(script), cwd=tmp, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp, "PYTHONIOENCODING": "utf-8"},
            preexec_fn=_limits(memory_mb, cpu_s), start_new_session=True,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except asyncio.TimeoutError:
            raise ToolError(f"python: killed after {timeout_s:g} s (time limit)") from None
        finally:
            if proc.returncode is None:  # timed out or cancelled: kill the whole group, reap it
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(Exception):
                    await asyncio.shield(proc.wait())
        return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


class PythonSandbox:
    name = "python"
    description = "Run a Python 3 program and return what it prints (stdout, then stderr)."
    parameters = {"type": "object", "properties": {"code": {"type": "string", "description": "Python source."}},
                  "required": ["code"]}

    def __init__(self, timeout_s: float = 5.0, memory_mb: int = 256, cpu_s: int = 5):
        self.timeout_s, self.memory_mb, self.cpu_s = timeout_s, memory_mb, cpu_s

    async def run(self, args: dict) -> str:
        rc, out, err = await run_python(str(args["code"]), self.timeout_s, self.memory_mb, self.cpu_s)
        text = out
        if err.strip():
            text += ("" if not text or text.endswith("\n") else "\n") + err
        if rc != 0:
            reason = {-signal.SIGXCPU: "CPU time limit", -signal.SIGKILL: "killed (memory or time limit)"}.get(rc, "")
            text = (text.rstrip() + "\n" if text.strip() else "") + f"(exit code {rc}{', ' + reason if reason else ''})"
        return text if text.strip() else "(no output)"
