"""What the weight benchmarks share (bench/weight_sync.py, bench/weight_fanout.py, bench/lora.py): the
weight store started as a subprocess with a fixed token, waiting for it to answer, a synthetic bf16 state
dict and a process's peak RSS. Imports no torch until a state dict is made (the fan-out's fetcher
processes import this module)."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

TOKEN = "bench-weights-token"


def make_state_dict(gib: float) -> dict[str, torch.Tensor]:
    """About `gib` GiB of bf16 4096x4096 matrices (at least one), seeded."""
    import torch

    total = int(gib * (1 << 30))
    per = 4096 * 4096 * 2  # 32 MiB bf16 matrices
    n = max(1, total // per)
    g = torch.Generator().manual_seed(0)
    return {f"layers.{i}.weight": torch.randn(4096, 4096, generator=g).to(torch.bfloat16) for i in range(n)}


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_service_argv(root: Path, port: int, host: str = "127.0.0.1") -> list[str]:
    return [sys.executable, "-m", "launcher.cli", "weights", "serve", f"weights.root={root}", f"weights.port={port}",
            f"weights.host={host}", f"weights.token={TOKEN}", "telemetry.log_level=WARNING",
            "telemetry.metrics_port=-1"]


def wait_http(url: str, timeout_s: float, log: Path | None = None, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"weight store exited: {proc.stderr.read().decode()[-2000:]}") from None
            time.sleep(0.1)
    tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
    raise TimeoutError(f"{url} did not answer in {timeout_s:.0f}s {tail}")


def start_service(root: Path, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(start_service_argv(root, port), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", 60, proc=proc)
    except TimeoutError:
        proc.kill()
        raise
    return proc
