"""Per-sandbox limits, against real bubblewrap and real cgroups: one sandbox cannot
change another's reward. A fork bomb beside honest completions leaves their reward at 1 (each sandbox
has its own pids.max; RLIMIT_NPROC, shared by uid 65534 across sandboxes, is no longer the bound), four
forked children together cannot pass the sandbox's memory limit, and the work dir is a size-limited
tmpfs: writing past it fails inside while the host's disk is untouched. Needs root (or a delegated
cgroup): skipped on a developer's machine without, failed under CI=true."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading

import pytest
from ci_gate import unavailable

from reward_service.scorers import code
from rollout_service.tools.python_sandbox import PythonSandbox
from shared.runtime import sandbox, sandbox_cgroup

BYPASS = ("import __main__\n"
          "try:\n    __main__.audit.__code__ = (lambda event, args: None).__code__\nexcept AttributeError:\n    pass\n")
GOOD = "def add(a, b):\n    return a + b\n"
TESTS = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]


@pytest.fixture(scope="module", autouse=True)
def cgroups():
    if shutil.which("bwrap") is None:
        unavailable("bubblewrap is not installed (apt-get install bubblewrap)")
    if sandbox_cgroup.detect() is None:
        unavailable("no usable cgroup for sandboxes (run as root, or delegate a cgroup v2 with memory and pids)")
    saved = code.SandboxLimits(**vars(code.LIMITS))
    code.LIMITS.wall_s = 4.0
    yield
    for k, v in vars(saved).items():
        setattr(code.LIMITS, k, v)


def test_a_fork_bomb_beside_honest_completions_does_not_change_their_reward():
    # the bomb holds every process its pids.max allows (sleeping, so it takes no CPU) for 3 s, while
    # honest completions start their own sandboxes; with one shared RLIMIT_NPROC they failed in setpriv
    bomb = BYPASS + """
import os, time
n = 0
for _ in range(400):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
    except OSError:
        break
time.sleep(3)
""" + GOOD
    results: dict = {}

    def run_bomb():
        results["bomb"] = code.score(bomb, [*TESTS, "assert 32 <= n < 400"])  # it filled its pids.max

    t = threading.Thread(target=run_bomb)
    t.start()
    import time

    time.sleep(0.8)  # the bomb has filled its cgroup by now
    honest: list = []

    def run_honest():  # several at once, as the service's executor scores them
        for _ in range(3):
            honest.append(code.score(GOOD, TESTS))
            honest.append(code.score("print(sum(map(int, input().split())))", [{"input": "2 3", "output": "5"}]))

    workers = [threading.Thread(target=run_honest) for _ in range(4)]
    for w in workers:
        w.start()
    for w in [*workers, t]:
        w.join()
    assert results["bomb"].reward == 1.0, results["bomb"]
    assert [s.reward for s in honest] == [1.0] * len(honest), honest
    assert all(s.error is None for s in honest), honest


# four children each touching 200 MiB (each under RLIMIT_AS, per process), then holding it; the parent
# says how many of them ended normally (the kernel kills the others at the cgroup's limit)
FOUR_CHILDREN = """
import os, time
kids = []
for i in range(4):
    pid = os.fork()
    if pid == 0:
        block = b"x" * (200 << 20)
        time.sleep(2)
        os._exit(0)
    kids.append(pid)
ok = sum(1 for pid in kids if os.waitpid(pid, 0)[1] == 0)
print("survivors", ok, flush=True)
"""


def test_four_forked_children_together_cannot_pass_the_memory_limit():
    limits = sandbox.Limits(cpu_s=10, memory_mb=512)
    out = sandbox.run([sandbox.python_binary(), "-I", "-S", "-c", BYPASS + FOUR_CHILDREN], None, limits, 10.0)
    assert out.memory_limit, out  # the kernel's OOM killer acted inside this sandbox's cgroup
    text = out.stdout.decode()
    if "survivors" in text:  # the parent itself may be the one killed
        assert int(text.split()[1]) * 200 <= 512, text


def test_the_python_tool_gets_the_same_whole_sandbox_memory_limit():
    out = asyncio.run(PythonSandbox(timeout_s=10, memory_mb=512).run({"code": FOUR_CHILDREN}))
    assert "survivors 4" not in out, out
    assert "survivors" in out or "killed" in out, out


def test_writing_past_the_disk_quota_fails_inside_and_the_host_is_untouched():
    free_before = shutil.disk_usage(tempfile.gettempdir()).free
    program = """
import errno
for path in ("/sandbox/big", "/tmp/big"):
    try:
        with open(path, "wb") as f:
            for _ in range(300):
                f.write(b"x" * (1 << 20))
        print("wrote", path)
    except OSError as exc:
        print("refused", path, errno.errorcode[exc.errno])
"""
    limits = sandbox.Limits(cpu_s=10, memory_mb=512, disk_mb=16, file_bytes=1 << 30)
    out = sandbox.run([sandbox.python_binary(), "-I", "-S", "-c", program], None, limits, 10.0)
    text = out.stdout.decode()
    assert "refused /sandbox/big ENOSPC" in text, (text, out.stderr)
    assert "wrote /tmp/big" not in text, text  # /tmp is size-limited too (and not writable as root's nobody)
    assert shutil.disk_usage(tempfile.gettempdir()).free > free_before - (64 << 20)


def test_the_sandbox_cgroup_is_removed_and_nothing_is_left_running():
    s = sandbox.Session([sandbox.python_binary(), "-I", "-S", "-c", "import time; print(1, flush=True); "
                         "time.sleep(30)"], sandbox.Limits(), 10)
    assert s.readline() == b"1"
    dirs = list(s.cgroup.dirs)
    assert all((d / "cgroup.procs").read_text().split() for d in dirs)
    s.finish()
    assert not any(d.exists() for d in dirs)
