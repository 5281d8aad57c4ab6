"""The sandbox holds: the `code` scorer and the rollout `python` tool run each program in a
bubblewrap sandbox (shared/runtime/sandbox.py). Each escape is tried in both, after the two-line switch-off of
the scorer's audit hook: root commands, a socket to the host's 127.0.0.1, writing outside the work dir,
a detached child that outlives the call, a fork bomb (bounded, so a broken sandbox cannot take the test
machine down) and a 200 MB print. Under CI=true a missing bwrap fails these tests instead of skipping."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import time
import uuid
from pathlib import Path

import pytest
from ci_gate import unavailable

from reward_service.scorers import code
from rollout_service.tools.python_sandbox import PythonSandbox


@pytest.fixture(autouse=True)
def bwrap():
    if shutil.which("bwrap") is None:
        unavailable("bubblewrap is not installed (apt-get install bubblewrap)")


# The two lines: switch the harness's audit hook off from the program (a no-op in the tool).
BYPASS = ("import __main__\n"
          "try:\n    __main__.audit.__code__ = (lambda event, args: None).__code__\nexcept AttributeError:\n    pass\n")


def in_scorer(program: str) -> str:
    """What the program printed ("HELD" / "ESCAPED ...") as the scorer sees it: a stdin/stdout test
    expecting HELD passes only if the program printed exactly that."""
    s = code.score(BYPASS + program, [{"input": "", "output": "HELD"}])
    return "HELD" if s.reward == 1.0 else f"ESCAPED or failed: {s}"


def in_tool(program: str, timeout_s: float = 10.0) -> str:
    out = asyncio.run(PythonSandbox(timeout_s=timeout_s).run({"code": BYPASS + program}))
    return "HELD" if out.strip().startswith("HELD") else f"ESCAPED or failed: {out[:500]}"


RUNNERS = {"scorer": in_scorer, "tool": in_tool}


def processes_with(marker: str) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if marker.encode() in (p / "cmdline").read_bytes():
                    pids.append(int(p.name))
            except OSError:
                pass
    return pids


@pytest.fixture
def marker():
    m = f"jetrl-escape-{uuid.uuid4().hex}"
    yield m
    for pid in processes_with(m):  # only what this test started (a broken sandbox's survivors)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("where", RUNNERS)
def test_no_root_and_no_host_files_after_switching_the_audit_hook_off(where, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    program = f"""
import os, subprocess
bad = []
if os.getuid() == 0 or os.getgid() == 0:
    bad.append("uid 0")
try:
    if subprocess.run(["id", "-u"], capture_output=True).stdout.strip() == b"0":
        bad.append("id -u = 0")
except Exception:
    pass
for path in ({str(secret)!r}, "/etc/shadow", "/etc/passwd", "/root/.bashrc"):
    try:
        open(path).read()
        bad.append("read " + path)
    except Exception:
        pass
print("ESCAPED " + ", ".join(bad) if bad else "HELD")
"""
    assert RUNNERS[where](program) == "HELD"


@pytest.mark.parametrize("where", RUNNERS)
def test_no_network_to_the_hosts_loopback(where):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    program = f"""
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2).sendall(b"hi")
    print("ESCAPED connected")
except OSError:
    print("HELD")
"""
    try:
        assert RUNNERS[where](program) == "HELD"
        with pytest.raises(TimeoutError):
            srv.accept()  # nothing reached the host
    finally:
        srv.close()


@pytest.mark.parametrize("where", RUNNERS)
def test_no_writes_outside_the_work_dir(where, tmp_path):
    target = tmp_path / "escaped.txt"
    program = f"""
wrote = []
for path in ({str(target)!r}, "/tmp/jetrl-escaped-{uuid.uuid4().hex}", "/usr/jetrl-escaped"):
    try:
        open(path, "w").write("x")
        wrote.append(path)
    except Exception:
        pass
print("ESCAPED " + " ".join(wrote) if wrote else "HELD")
"""
    assert RUNNERS[where](program) == "HELD"
    assert not target.exists()


@pytest.mark.parametrize("where", RUNNERS)
def test_a_detached_child_does_not_outlive_the_call(where, marker):
    program = f"""
import os, sys
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", {marker!r}])
    os._exit(0)
print("HELD")
"""
    RUNNERS[where](program)
    time.sleep(1.0)  # the kernel tears the pid namespace down
    assert processes_with(marker) == [], "a child of the program is still running"


@pytest.mark.parametrize("where", RUNNERS)
def test_a_fork_bomb_is_bounded_and_leaves_nothing_behind(where, marker):
    # bounded on purpose: 300 sleeping children at most, even if the sandbox failed
    program = f"""
import os, sys, time
n = 0
for _ in range(300):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", {marker!r}])
    n += 1
print("HELD" if n <= 64 else f"ESCAPED {{n}} processes")
"""
    assert RUNNERS[where](program) == "HELD"
    time.sleep(1.0)
    assert processes_with(marker) == []


def test_a_200_mb_print_is_cut_in_the_tool():
    t0 = time.monotonic()
    out = asyncio.run(PythonSandbox(timeout_s=20, output_bytes=64 * 1024).run(
        {"code": 'for _ in range(2000):\n    print("x" * 100_000)'}))  # 200 MB in all
    assert len(out) < 80 * 1024 and "output over 65536 bytes" in out
    assert time.monotonic() - t0 < 20  # stopped at the cap, not at the time limit


def test_a_200_mb_print_is_cut_in_the_scorer():
    s = code.score(BYPASS + 'import sys\nfor _ in range(2000):\n    sys.__stdout__.write("x" * 100_000)\n',
                   [{"input": "", "output": "HELD"}])
    assert s.reward == 0.0 and s.error and "output" in s.error, s


def test_a_read_only_dir_under_the_hosts_tmp_stays_visible_over_the_private_tmp():
    # a venv under /tmp (a clone checked out there) is bound on top of the sandbox's own /tmp
    import tempfile

    from shared.runtime import sandbox

    shown = Path(tempfile.mkdtemp(prefix="jetrl-ro-", dir="/tmp"))
    work = Path(tempfile.mkdtemp(prefix="jetrl-work-", dir="/tmp"))
    try:
        (shown / "marker.txt").write_text("visible")
        os.chmod(shown, 0o755)
        os.chmod(shown / "marker.txt", 0o644)
        sandbox.prepare_workdir(work)
        out = sandbox.run(["/bin/cat", str(shown / "marker.txt")], work, sandbox.Limits(), 20, ro_dirs=[str(shown)])
        assert out.stdout.decode() == "visible", out.stderr.decode()
    finally:
        shutil.rmtree(shown, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
