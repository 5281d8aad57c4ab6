"""exact, regex, maxdigit, sort and math-verify scorers; scorer loading and result normalisation."""

from __future__ import annotations

import pytest

from reward_service.scorers import (
    Score,
    ScorerError,
    call_scorer,
    exact,
    load_scorer,
    maxdigit,
    regex,
    scorer_ref,
    sortdigits,
)
from reward_service.scorers import math as math_scorer


def test_exact_strips_ascii_whitespace_only_and_accepts_a_list():
    assert exact.score("  hello\n", "hello").reward == 1.0
    assert exact.score("Hello", "hello").reward == 0.0
    assert exact.score("\u00a0hello", "hello").reward == 0.0  # NBSP is not stripped: same as the Node service
    assert exact.score("b", ["a", "b"]).reward == 1.0
    with pytest.raises(ValueError, match="reference must be a string"):
        exact.score("1", 1)


def test_regex_modes_and_flags():
    assert regex.score("abc 123", r"\d+").reward == 1.0
    assert regex.score("abc", r"\d+").reward == 0.0
    assert regex.score("ABC", {"pattern": "abc", "flags": "i", "mode": "fullmatch"}).reward == 1.0
    assert regex.score("xabc", {"pattern": "abc", "mode": "match"}).reward == 0.0
    with pytest.raises(ValueError, match="not a valid regex"):
        regex.score("x", "(")


def test_maxdigit_rewards_the_largest_digit_first():
    assert maxdigit.score(" 8 and more", "8").reward == 1.0
    assert maxdigit.score("3", "8").reward == 0.0
    assert maxdigit.score("", "8").reward == 0.0
    with pytest.raises(ValueError, match="one digit"):
        maxdigit.score("8", "88")


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("012358", 1.0),
        ("  012358\n", 1.0),  # leading whitespace is skipped
        ("0123589999", 1.0),  # past the reference's length: ignored
        ("012385", 4 / 6),  # the last two swapped
        ("853210", 0.0),  # reversed: no digit in its place
        ("0123", 4 / 6),  # too short: the missing two are wrong
        ("0 1 2 3", 1 / 6),  # spaces take positions: only the first 0 lines up
        ("", 0.0),
        ("xyz358", 0.5),
    ],
)
def test_sort_rewards_the_fraction_of_positions_right(completion, reward):
    s = sortdigits.score(completion, "012358")
    assert s.reward == pytest.approx(reward)
    assert s.metrics["exact"] == (1.0 if reward == 1.0 else 0.0)


def test_sort_refuses_a_reference_that_is_not_digits():
    for bad in ("", "0 1 2", 12, None):
        with pytest.raises(ValueError, match="string of digits"):
            sortdigits.score("012", bad)
    assert load_scorer(scorer_ref("sort")) is sortdigits.score


@pytest.mark.parametrize(
    ("completion", "reference", "reward"),
    [
        ("The answer is $\\boxed{\\frac{1}{2}}$", "0.5", 1.0),
        ("$\\boxed{0.5}$", "\\frac{1}{2}", 1.0),
        ("So we get $\\boxed{(x+1)^2}$", "x^2 + 2x + 1", 1.0),
        ("$\\boxed{\\sqrt{8}}$", "2\\sqrt{2}", 1.0),
        ("The result is $\\boxed{3}$", "4", 0.0),
        ("$\\boxed{\\{1, 2\\}}$", "\\{2, 1\\}", 1.0),
        ("I do not know", "7", 0.0),
    ],
)
def test_math_verify_equivalence(completion, reference, reward):
    assert math_scorer.score(completion, reference).reward == reward


def test_math_rejects_an_empty_reference():
    with pytest.raises(ValueError, match="empty"):
        math_scorer.score("1", "  ")


def test_scorer_paths_resolve_and_bad_ones_name_the_problem():
    assert load_scorer("reward_service.scorers.exact:score") is exact.score
    assert scorer_ref("gsm8k") == "reward_service.scorers.gsm8k:score"
    with pytest.raises(ScorerError, match="no built-in scorer"):
        scorer_ref("nope")
    with pytest.raises(ScorerError, match="package.module:name"):
        load_scorer("just_a_name")
    with pytest.raises(ScorerError, match="no module named"):
        load_scorer("no_such_module_xyz:fn")
    with pytest.raises(ScorerError, match="has no attribute"):
        load_scorer("reward_service.scorers.exact:nope")


def test_scorer_failures_become_errors_with_reward_zero():
    s = call_scorer(load_scorer("reward_test_scorers:broken"), "x", None, {})
    assert s.reward == 0.0 and "always fails" in s.error
    s = call_scorer(load_scorer("reward_test_scorers:not_a_number"), "x", None, {})
    assert s.reward == 0.0 and "expected a number" in s.error
    assert call_scorer(lambda c, r, p: (0.5, {"k": 1}), "x", None, {}) == Score(0.5, {"k": 1}, None)
    assert call_scorer(lambda c, r, p: float("nan"), "x", None, {}).error.startswith("scorer returned a non-finite")
