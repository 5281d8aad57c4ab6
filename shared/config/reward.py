"""Reward service and its client (docs/reward.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from shared.config.base import Section


class CodeSandboxConfig(Section):
    """Limits of the `code` scorer's sandboxed subprocess (one per completion)."""

    wall_s: float = Field(
        4.0, gt=0, description="Wall-clock limit of one sandboxed run (the process group is killed); "
        "the service waits at least this + 2 s for it."
    )
    cpu_s: int = Field(3, ge=1, description="RLIMIT_CPU of the sandboxed process, seconds.")
    memory_mb: int = Field(
        512, ge=64, description="Memory of one sandbox, MiB: the memory limit of its cgroup (all its processes and "
        "its tmpfs files together, swap included) and RLIMIT_AS of each process.")
    output_bytes: int = Field(1 << 20, ge=1024, description="Cap on the program's output (per test and per file).")
    max_tests: int = Field(100, ge=1, description="Most test cases one reference may carry.")
    pids: int = Field(64, ge=4, description="pids.max of one sandbox's cgroup (without cgroups: RLIMIT_NPROC, which "
                      "uid 65534's processes share across all sandboxes).")
    disk_mb: int = Field(64, ge=1, description="Size of one sandbox's tmpfs work dir (and of its /tmp), MiB.")
    cgroups: Literal["auto", "v2", "v1", "off"] = Field(
        "auto", description="Per-sandbox cgroup: auto = v2 when its memory and pids controllers can be delegated, "
        "else v1 memory+pids, else none (rlimits only, with a warning); off = rlimits only.")
    cgroup_parent: str = Field(
        "", description="cgroup v2 directory delegated to the service to create sandbox cgroups under ('' = the "
        "service's own cgroup, usable when it holds no processes or is the root).")


class RewardConfig(Section):
    task: str = Field("gsm8k", description="Reward task: a built-in scorer name, served on jetrl.reward.<task>.")
    scorer: str = Field("", description="Custom scorer as 'package.module:function' ('' = the built-in for `task`).")
    executor: Literal["auto", "inline", "thread", "process"] = Field(
        "auto",
        description="Where scoring runs: inline (event loop), thread, process (killable pool). auto = the "
        "built-in's choice (gsm8k/exact/maxdigit/sort inline, math/regex process, code thread; custom: thread).",
    )
    concurrency: int = Field(64, ge=1, description="Requests one service process scores at once.")
    processes: int = Field(0, ge=0, description="Size of the process pool for `process` scorers (0 = CPU count).")
    timeout_s: float = Field(10.0, gt=0, description="Client: time to wait for one reply before retrying.")
    retries: int = Field(3, ge=0, description="Client: retries on timeout or no responders.")
    retry_backoff_s: float = Field(0.2, ge=0, description="Client: first pause before a retry (doubles, max 2 s).")
    scorer_timeout_s: float = Field(5.0, gt=0, description="Service: time limit of scoring one completion.")
    max_scorer_timeout_s: float = Field(
        60.0, gt=0, description="Service: cap on a request's own `timeout_s` (callers may ask for less or more)."
    )
    max_completions: int = Field(4096, ge=1, description="Service: most completions in one request.")
    code: CodeSandboxConfig = Field(default_factory=CodeSandboxConfig)

