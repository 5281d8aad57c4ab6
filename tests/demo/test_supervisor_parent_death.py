"""A supervisor killed with SIGKILL takes its children down (shared/runtime/parent_death.py): the `jetrl nats` child
that `jetrl up` starts gets SIGTERM and stops its nats-server, and a child's own children do not take the
supervisor's mark for theirs."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from shared.runtime.natsd import free_port
from shared.runtime.parent_death import SUPERVISOR_ENV
from testkit.fault_scenario import alive  # a zombie nobody has reaped yet counts as gone

ROOT = Path(__file__).resolve().parents[2]

# A supervisor of one child, as `jetrl up` runs it; prints the child's pid, then waits to be killed.
DRIVER = textwrap.dedent("""
    import asyncio, json, sys
    from launcher.supervisor import ProcessSpec, Supervisor

    async def main():
        sup = Supervisor([ProcessSpec("child", json.loads(sys.argv[1]))], sys.argv[2], echo=False)
        await sup.start()
        while sup.children["child"].proc is None:
            await asyncio.sleep(0.05)
        print(sup.children["child"].proc.pid, flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
""")


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_driver(argv: list[str], run_dir: Path) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(argv), str(run_dir)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, text=True)
    return driver, int(driver.stdout.readline())


def wait_for(cond, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def test_a_sigkilled_supervisor_takes_its_nats_child_and_the_server_down(tmp_path):
    port = free_port()
    argv = [sys.executable, "-m", "launcher.cli", "nats", "--port", str(port), "--store-dir", str(tmp_path / "js"),
            "--insecure-no-auth"]
    driver, child = start_driver(argv, tmp_path / "run")
    try:
        assert wait_for(lambda: listening(port), 60), "jetrl nats never listened"
        driver.kill()
        driver.wait(10)
        assert wait_for(lambda: not alive(child), 20), "the jetrl nats child outlived its supervisor"
        assert wait_for(lambda: not listening(port), 20), "its nats-server outlived the supervisor"
    finally:
        driver.kill()
        if alive(child):
            os.kill(child, signal.SIGKILL)


GRANDPARENT = textwrap.dedent(f"""
    import os, subprocess, sys, time
    from shared.runtime.parent_death import die_with_supervisor
    die_with_supervisor()
    # what the child's own child sees: the mark must be gone
    out = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get({SUPERVISOR_ENV!r}, '-'))"],
                         capture_output=True, text=True).stdout.strip()
    open(sys.argv[1], "w").write(out)
    time.sleep(600)
""")


def test_the_mark_is_not_inherited_and_an_unmarked_child_is_left_alone(tmp_path):
    seen = tmp_path / "seen"
    script = tmp_path / "child.py"
    script.write_text(GRANDPARENT)
    driver, child = start_driver([sys.executable, str(script), str(seen)], tmp_path / "run")
    try:
        assert wait_for(seen.exists, 30) and wait_for(lambda: seen.read_text() != "", 5)
        assert seen.read_text() == "-"  # the grandchild saw no mark
        driver.kill()
        driver.wait(10)
        assert wait_for(lambda: not alive(child), 20), "the marked child outlived its supervisor"
    finally:
        driver.kill()
        if alive(child):
            os.kill(child, signal.SIGKILL)

    # the control: a process started without the supervisor (no mark) keeps running when its parent dies
    seen.unlink()
    env = {k: v for k, v in os.environ.items() if k != SUPERVISOR_ENV}
    env["PYTHONPATH"] = str(ROOT)
    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys; p = subprocess.Popen(sys.argv[1:]); print(p.pid, flush=True);"
                               " import time; time.sleep(600)", sys.executable, str(script), str(seen)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    orphan = int(parent.stdout.readline())
    try:
        assert wait_for(seen.exists, 30)
        parent.kill()
        parent.wait(10)
        time.sleep(1.0)
        assert alive(orphan)
    finally:
        parent.kill()
        if alive(orphan):
            os.kill(orphan, signal.SIGKILL)
