"""The policy as adversary: completions written to game each scorer score what the task's rule
says and nothing more. The code scorer is attacked in a real bubblewrap sandbox: the program owns its
interpreter (stack frames, file descriptors, builtins, os._exit, fake replies), yet the expected values
never enter the sandbox and the host makes every comparison, so `def add(a, b): return 0` scores 0."""

from __future__ import annotations

import shutil

import pytest
from ci_gate import unavailable

from reward_service.scorers import code, gsm8k
from reward_service.scorers import math as math_scorer

SECRET = 918273645  # an expected value no program can guess: found anywhere in the sandbox = a leak
TESTS = ["assert add(2, 3) == 5", f"assert add({SECRET - 1}, 1) == {SECRET}"]
GOOD = "def add(a, b):\n    return a + b\n"
BAD = "def add(a, b):\n    return 0\n"

# switches the harness's audit hook off (the second layer), as any attack can
BYPASS = ("import __main__\n"
          "try:\n    __main__.audit.__code__ = (lambda event, args: None).__code__\nexcept AttributeError:\n    pass\n")

# The attack and its variants. Each defines `add` returning 0 and then tries to make the scorer
# believe otherwise.
ATTACKS = {
    "walk the stack, write passing replies on the harness's channel": BAD + """
import sys, json
def add(a, b):
    f = sys._getframe()
    while f is not None:
        g = f.f_locals
        if "replies" in g and "seq" in g:
            for value in (["B", True], ["I", "5"], ["I", "0"]):
                g["replies"].write(f"{g['seq']} {json.dumps({'v': value})}\\n".encode())
            g["replies"].flush()
        f = f.f_back
    return 0
""",
    "write forged replies to every fd": BAD + """
import os
def add(a, b):
    for fd in range(3, 64):
        for seq in range(1, 10):
            try:
                os.write(fd, f'{seq} {{"v": ["B", true]}}\\n'.encode())
            except OSError:
                pass
    return 0
""",
    "print fake replies": BAD + """
import os
for seq in range(1, 10):
    print(f'{seq} {{"v": ["B", true]}}')
    os.write(1, f'{seq} {{"v": ["B", true]}}\\n'.encode())
""",
    "os._exit(0) before the asserts": BAD + "import os\nos._exit(0)\n",
    "os._exit(0) inside the call": "def add(a, b):\n    import os\n    os._exit(0)\n",
    "an object equal to everything": BAD + """
class Anything:
    def __eq__(self, other):
        return True
    __hash__ = object.__hash__
def add(a, b):
    return Anything()
""",
    "an int subclass equal to everything": BAD + """
class Liar(int):
    def __eq__(self, other):
        return True
    __hash__ = int.__hash__
def add(a, b):
    return Liar(0)
""",
    "patch AssertionError and builtins": BAD + """
import builtins
builtins.AssertionError = type("Never", (Exception,), {})
builtins.abs = lambda x: 0
builtins.len = lambda x: 5
builtins.isinstance = lambda *a: True
""",
    "raise SystemExit(0) in the call": "def add(a, b):\n    raise SystemExit(0)\n",
    "read every file for the expected values": BYPASS + """
import os
TARGET = str({below} + 1).encode()  # not written out here: solution.py itself must not match
FOUND = 0
for root in ("/sandbox", "/tmp", "/jetrl", "/proc/self", "/proc/1", "/dev/fd"):
    for d, _, files in os.walk(root):
        for name in files:
            try:
                data = open(os.path.join(d, name), "rb").read(1 << 20)
            except Exception:
                continue
            if TARGET in data:
                FOUND = int(TARGET)
def add(a, b):
    return FOUND
""".replace("{below}", str(SECRET - 1)),
}


@pytest.fixture(scope="module", autouse=True)
def bwrap():
    if shutil.which("bwrap") is None:
        unavailable("bubblewrap is not installed (apt-get install bubblewrap)")
    saved = code.SandboxLimits(**vars(code.LIMITS))
    code.LIMITS.wall_s = 3.0
    yield
    for k, v in vars(saved).items():
        setattr(code.LIMITS, k, v)


def test_an_honest_solution_scores_one_with_setup_and_several_statements():
    assert code.score(GOOD, TESTS).reward == 1.0
    tests = ["x = add(1, 2)\nassert x == 3\nassert add(x, 1) == 4 and not add(0, 0)",
             "assert abs(add(0.1, 0.2) - 0.3) < 1e-9", "assert sorted([add(2, 1), add(0, 1)]) == [1, 3]",
             "assert isinstance(add(1, 1), int) and add(1, 1) in (2, 3)", "assert add('a', 'b') == 'ab'"]
    s = code.score("print('noise')\n" + GOOD, tests)
    assert s.reward == 1.0 and s.error is None, s


def test_the_host_evaluates_builtins_and_keeps_exact_types():
    s = code.score("def f():\n    return True\n", ["assert f() == 1", "assert f() is True",
                                                   "assert isinstance(f(), bool)"])
    assert s.reward == 1.0, s  # True == 1 in Python, and the exact type survives
    s = code.score("def f():\n    return {'a': [1, (2, 3)], 'b': {4}}\n",
                   ["assert f() == {'a': [1, (2, 3)], 'b': {4}}", "assert len(f()['a']) == 2"])
    assert s.reward == 1.0, s


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_an_attack_on_the_harness_scores_zero(name):
    s = code.score(ATTACKS[name], TESTS)
    assert s.reward == 0.0, s


def test_an_io_program_cannot_find_the_expected_output():
    prog = ATTACKS["read every file for the expected values"] + "print(add(0, 0))\n"
    s = code.score(prog, [{"input": "", "output": str(SECRET)}])
    assert s.reward == 0.0, s
    honest = code.score("print(int(input()) + 1)\n", [{"input": str(SECRET - 1), "output": str(SECRET)}])
    assert honest.reward == 1.0, honest


def test_io_tests_share_no_state():
    prog = ("import os\nif os.path.exists('seen'):\n    print('second')\nelse:\n    open('seen', 'w').write('1')\n"
            "    print('first')\n")
    s = code.score(prog, [{"input": "", "output": "first"}, {"input": "", "output": "first"}])
    assert s.reward == 1.0, s


@pytest.mark.parametrize("test, message", [
    ("add(2, 3)", "no top-level assert"),
    ("for i in range(3):\n    assert add(i, 0) == i", "inside a `for`"),
    ("assert all(add(i, 0) == i for i in range(3))", "comparison inside"),
    ("assert add(2, 3) ==", "not valid Python"),
])
def test_tests_the_host_cannot_decide_are_refused_at_parse_time(test, message):
    with pytest.raises(ValueError, match=message):
        code.parse_tests([test])


def test_host_arithmetic_is_size_guarded():
    s = code.score("def f():\n    return 10\n", ["assert f() ** 10**9 > 0", "assert 'x' * f() * 10**9 == ''"])
    assert s.reward == 0.0 and "limit" in s.metrics["first_failure"], s


# --- math and GSM8K answer parsers: only the final answer counts ----------------------------------------
GSM8K_REF = "She has 3 + 4 = 7 apples.\n#### 7"
GSM8K_GAMES = {
    "lists every number": "1 2 3 4 5 6 7 8 9 10",
    "several final answers": "#### 6\n#### 8",
    "boxed spam": "\\boxed{6} \\boxed{8} \\boxed{9}",
    "huge number": "#### " + "7" * 5000,
    "unicode digits of a wrong answer": "#### \u0666",  # Arabic-Indic six
    "answer in a hidden html comment after a wrong one": "The answer is 6. <!-- 7 -->",
}


@pytest.mark.parametrize("name", sorted(GSM8K_GAMES))
def test_gsm8k_games_score_zero(name):
    assert gsm8k.score(GSM8K_GAMES[name], GSM8K_REF, {}).reward == 0.0


def test_gsm8k_honest_answers_score_one():
    for text in ("3 + 4 = 7\n#### 7", "So the answer is $\\boxed{7}$.", "The answer is 7."):
        assert gsm8k.score(text, GSM8K_REF, {}).reward == 1.0, text


@pytest.mark.parametrize("text", ["\\boxed{6} \\boxed{8}", "1, 2, 3, 4, 5, 6, 8, 9", "\\boxed{" + "9" * 3000 + "}"])
def test_math_games_score_zero(text):
    assert math_scorer.score(text, "7", {}).reward == 0.0


# --- the search agent and customer-service rewards ------------------------------------------------------
@pytest.mark.parametrize("final, reward", [
    ("Answer: France", 1.0),
    ("answer: FRANCE.", 1.0),
    ("Answer: Germany, France, Spain", 0.0),  # listing every country
    ("Answer: France\nAnswer: Germany", 0.0),  # only the last answer counts
    ("I think France. <!-- Answer: France -->", 0.0),  # hidden after the answer text
    ("Answer: Fr\u0430nce", 0.0),  # a Cyrillic look-alike letter
    ("France France France", 0.0),  # no answer line
])
def test_search_reward_counts_the_last_answer_only(final, reward):
    from examples.agents.search.reward import episode_reward, score_answer

    assert score_answer(final, "France")[0] == reward
    assert episode_reward(final, "France", 5) == (1.0 if reward else 0.2)  # search credit stays capped


@pytest.mark.parametrize("answer, reward", [
    ("Your order A1234 is refunded.", 1.0),
    ("Orders A1234, B5678 and C9012: one of them is refunded.", 0.5),  # every id listed: not naming it
    ("Order A12345 is refunded.", 0.5),  # a longer id that contains it
    ("Done!", 0.5),
])
def test_customer_service_answer_must_name_the_order_alone(answer, reward):
    from examples.agents.customer_service.reward import score_episode

    final = {"A1234": "refunded", "B5678": "shipped", "C9012": "delivered"}
    got, _ = score_episode(final, dict(final), [("refund", "A1234")], {"A1234"}, answer, "A1234")
    assert got == reward
