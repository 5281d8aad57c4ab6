"""The `code` scorer's sandbox: limits give reward 0 with an error, and the service keeps answering."""

from __future__ import annotations

import os

import pytest
from reward_fixtures import replicas, run_config

from reward_service.client import RewardClient
from reward_service.scorers import code

TESTS = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]
GOOD = "def add(a, b):\n    return a + b\n"

ESCAPES = {
    "infinite loop": ("while True:\n    pass\n" + GOOD, "timed out"),
    "fork bomb": ("import os\nwhile True:\n    os.fork()\n" + GOOD, "os.fork is not allowed"),
    "subprocess": ("import subprocess\nsubprocess.run(['true'])\n" + GOOD, "not allowed"),
    "huge output via print": ("print('x' * 10**8)\n" + GOOD, "output over"),
    "huge output via the fd": ("import os\nwhile True:\n    os.write(1, b'x' * 65536)\n", "output over"),
    "reading outside its dir": ("print(open('/etc/passwd').read())\n" + GOOD, "outside the sandbox dir"),
    "listing outside its dir": ("import os\nos.listdir('/')\n" + GOOD, "outside the sandbox dir"),
    "writing outside its dir": ("open('/tmp/jetrl-escaped', 'w').write('x')\n" + GOOD, "outside the sandbox dir"),
    "network": ("import socket\n" + GOOD, "not allowed"),
    "memory": ("x = bytearray(4 * 1024**3)\n" + GOOD, "memory limit"),
}


@pytest.fixture(scope="module", autouse=True)
def short_limits():
    saved = code.SandboxLimits(**vars(code.LIMITS))
    code.LIMITS.wall_s = 2.0
    yield
    for k, v in vars(saved).items():
        setattr(code.LIMITS, k, v)


def test_a_correct_program_passes_every_test_and_a_partial_one_gets_the_fraction():
    assert code.score(GOOD, TESTS).reward == 1.0
    half = code.score("def add(a, b):\n    return 5\n", TESTS)
    assert half.reward == 0.5 and half.error is None and half.metrics["passed"] == 1
    fenced = code.score("Here it is:\n```python\n" + GOOD + "```\nDone.", TESTS)
    assert fenced.reward == 1.0


def test_stdin_stdout_cases_are_compared_after_stripping():
    prog = "a, b = map(int, input().split())\nprint(a + b)\n"
    s = code.score(prog, [{"input": "2 3\n", "output": "5"}, {"input": "1 1", "output": "3"}])
    assert s.reward == 0.5 and s.error is None


def test_the_program_sees_no_inherited_secrets(monkeypatch):
    monkeypatch.setenv("JETRL_TEST_SECRET", "hunter2")
    prog = "import os\nassert 'JETRL_TEST_SECRET' not in os.environ\nassert os.getcwd().startswith('/')\n" + GOOD
    assert code.score(prog, TESTS).reward == 1.0


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_sandbox_limits_score_zero_with_an_error(name):
    program, message = ESCAPES[name]
    s = code.score(program, TESTS)
    assert s.reward == 0.0, s
    assert s.error and message in s.error, s
    assert not os.path.exists("/tmp/jetrl-escaped")


def test_bad_test_specs_are_errors_naming_the_problem():
    with pytest.raises(ValueError, match="non-empty list of tests"):
        code.score(GOOD, [])
    with pytest.raises(ValueError, match="must be an assert statement"):
        code.score(GOOD, [3])


async def test_escapes_through_the_service_leave_it_answering(nats_config, nc):
    cfg = run_config(nats_config, scorer_timeout_s=5.0)
    cfg.reward.code.wall_s = 2.0
    async with replicas(cfg, 1, "code"):
        client = RewardClient(nc, cfg.reward)
        programs = [p for p, _ in ESCAPES.values()]
        r = await client.score("code", programs + [GOOD], TESTS)
        assert r.rewards == [0.0] * len(programs) + [1.0]
        assert all(r.errors[: len(programs)]) and r.errors[-1] is None
        after = await client.score("code", [GOOD], {"tests": TESTS, "timeout_s": 1})
    assert after.rewards == [1.0]
