"""GSM8K scorer: every reference answer of the test split, in every supported format, and the rules."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from reward_service.scorers import gsm8k

DATA = Path(__file__).resolve().parents[1] / "data" / "gsm8k" / "test.jsonl"
ROWS = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()]

FORMATS = {
    "hash": "{sol}#### {ans}",
    "boxed": "{sol}So the final answer is $\\boxed{{{ans}}}$.",
    "answer_is": "{sol}The answer is {ans}.",
    "last_number": "{sol}In total that makes {ans}",
}


def _final(row: dict) -> str:
    return row["answer"].rsplit("####", 1)[1].strip()


def _solution(row: dict) -> str:
    # The worked solution without its final line: realistic text full of other numbers.
    return row["answer"].rsplit("####", 1)[0]


def test_the_test_split_is_complete():
    assert len(ROWS) == 1319


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_reference_answer_scores_one_in_each_format_and_zero_when_changed(fmt):
    wrong_right, wrong_changed = [], []
    for row in ROWS:
        ans = _final(row)
        completion = FORMATS[fmt].format(sol=_solution(row), ans=ans)
        s = gsm8k.score(completion, row["answer"])
        if s.reward != 1.0 or s.metrics["format"] != fmt:
            wrong_right.append((ans, s))
        changed = str(gsm8k.parse_number(ans) + 1)
        if gsm8k.score(FORMATS[fmt].format(sol=_solution(row), ans=changed), row["answer"]).reward != 0.0:
            wrong_changed.append(ans)
    assert wrong_right == []
    assert wrong_changed == []


@pytest.mark.parametrize(
    ("text", "value"),
    [("1,080", 1080), ("$1,080", 1080), ("-5", -5), ("−5", -5), ("18.00", 18), ("3/4", Fraction(3, 4)),
     ("0.5", Fraction(1, 2)), ("1,234,567.50", Fraction(2469135, 2)), ("- 7", -7), ("€12", 12), ("-$3", -3)],
)
def test_numbers_are_normalised(text, value):
    assert gsm8k.parse_number(text) == value


@pytest.mark.parametrize(
    ("completion", "reference", "reward"),
    [
        ("She makes $18 dollars.", "#### 18", 1.0),
        ("The answer is 1,080 meters.", "1080", 1.0),
        ("The answer is 18.00", "#### 18", 1.0),
        ("\\boxed{\\frac{3}{4}}", "0.75", 1.0),
        ("\\boxed{\\$1,200}", "1200", 1.0),
        ("\\boxed{50\\%}", "50", 1.0),
        ("The answer is -5.", "#### -5", 1.0),
        ("#### 7\n\nQuestion: next one... #### 9", "7", 1.0),  # the first #### is the model's answer
        ("first \\boxed{3} then \\boxed{4}", "4", 1.0),  # the last \boxed wins
        ("#### 5 but \\boxed{6}", "5", 1.0),  # #### comes before \boxed
        ("\\boxed{6} so the answer is 5", "6", 1.0),  # \boxed before "answer is"
        ("The answer is 5. Check: 2 + 3 = 5, and 10 more", "5", 1.0),  # "answer is" before last number
        ("no digits at all", "5", 0.0),
        ("", "5", 0.0),
        ("12.5", "12", 0.0),
    ],
)
def test_extraction_order_and_rules(completion, reference, reward):
    assert gsm8k.score(completion, reference).reward == reward


def test_an_unusable_reference_is_an_error_naming_it():
    with pytest.raises(ValueError, match="not a number"):
        gsm8k.score("#### 5", "#### five")


def test_a_megabyte_completion_is_scored_quickly_enough_to_stay_inline():
    text = "7 apples and " * 80_000 + "#### 42"
    assert gsm8k.score(text, "42").reward == 1.0
