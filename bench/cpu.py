"""CPU seconds of processes from Linux /proc, for the benchmarks that say where the cores went."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its reaped children (Linux /proc), 0 when gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


def tree_cpu(pid: int) -> float:
    """cpu_seconds of a process and of all its live descendants (the nats-server under `jetrl nats`, a
    trainer's ranks under torchrun)."""
    total = cpu_seconds(pid)
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        total += sum(tree_cpu(int(c)) for c in children)
    return total
