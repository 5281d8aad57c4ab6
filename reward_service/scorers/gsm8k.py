"""GSM8K: extract the final number of a completion and compare it numerically with the reference.

Extraction, first rule that finds a number wins (docs/reward.md):
1. `#### 42`        the FIRST `####` marker (GSM8K's own format; text after it is usually the model
                    running on into a new question);
2. `\\boxed{42}`     the LAST `\\boxed{...}` (braces balanced);
3. `The answer is 42` the LAST "answer is" / "answer:" phrase (case-insensitive), first number after it;
4. the LAST number anywhere in the completion.
Normalisation: thousands separators (`1,080`), currency ($ € £ ¥, "dollars", ...), unit and percent
words after the number, LaTeX wrappers (`\\text{}`, `\\$`, `\\,`, `\\frac{a}{b}`), a unicode minus,
trailing zeros (`18.00` = 18) and fractions (`3/4` = 0.75). The comparison is exact on rationals
(`fractions.Fraction`), so 0.1 + 0.2 style float error cannot creep in.

All regexes are linear-time, so this scorer runs inline in the service's event loop.
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache
from typing import Any

from reward_service.scorers import Score

# A number as written in text: optional sign, digits with optional thousands commas, decimals,
# or a fraction a/b. A comma is a thousands separator only in groups of exactly three digits.
_NUM = r"(?:[-−]\s?)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s?/\s?\d+(?:\.\d+)?)?|[-−]?\.\d+"
NUMBER_RE = re.compile(rf"(?<![\w.])(?:{_NUM})")
_CURRENCY = "$€£¥₹"
HASH_RE = re.compile(rf"####\s*[{_CURRENCY}]?\s*({_NUM})")
ANSWER_RE = re.compile(r"answer\s*(?:is|:|=)", re.IGNORECASE)
BOXED = "\\boxed{"
LATEX_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]*)\}\s*\{\s*([^{}]*)\}")
LATEX_JUNK_RE = re.compile(r"\\text\{([^{}]*)\}|\\mathrm\{([^{}]*)\}|\\[,;!]|\\\$|\\%|\\left|\\right|\$")


def parse_number(text: str) -> Fraction | None:
    """'1,080' -> 1080, '-5' -> -5, '18.00' -> 18, '3/4' -> 3/4, '$ 12' -> 12; None if not a number."""
    s = text.strip().replace("−", "-").replace(" ", "")
    s = s.lstrip(_CURRENCY)
    if s.startswith("-"):
        s = "-" + s[1:].lstrip(_CURRENCY)
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):
        s = s.replace(",", "")
    try:
        if "/" in s:
            num, den = s.split("/", 1)
            d = Fraction(den)
            return Fraction(num) / d if d else None
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def _boxed_contents(text: str) -> str | None:
    """Contents of the last \\boxed{...}, braces balanced; None when there is none."""
    start = text.rfind(BOXED)
    if start < 0:
        return None
    i = start + len(BOXED)
    depth = 1
    for j in range(i, min(len(text), i + 1000)):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def _clean_latex(s: str) -> str:
    s = LATEX_FRAC_RE.sub(lambda m: f"{m.group(1)}/{m.group(2)}", s)
    return LATEX_JUNK_RE.sub(lambda m: m.group(1) or m.group(2) or "", s)


def _first_number(s: str) -> str | None:
    m = NUMBER_RE.search(s)
    return m.group(0) if m else None


def _last_number(s: str) -> str | None:
    last = None
    for m in NUMBER_RE.finditer(s):
        last = m.group(0)
    return last


def extract_answer(completion: str) -> tuple[str | None, str]:
    """(the answer text, the rule that found it: hash | boxed | answer_is | last_number | none)."""
    m = HASH_RE.search(completion)
    if m:
        return m.group(1), "hash"
    boxed = _boxed_contents(completion)
    if boxed is not None:
        found = _first_number(_clean_latex(boxed))
        if found is not None:
            return found, "boxed"
    phrases = list(ANSWER_RE.finditer(completion[-100_000:]))
    last_phrase = phrases[-1] if phrases else None
    if last_phrase is not None:
        tail = completion[-100_000:]
        found = _first_number(_clean_latex(tail[last_phrase.end(): last_phrase.end() + 200]))
        if found is not None:
            return found, "answer_is"
    found = _last_number(completion)
    if found is not None:
        return found, "last_number"
    return None, "none"


def reference_number(reference: Any) -> Fraction:
    """The GSM8K answer: the text after the last '####' of a solution, or a bare number."""
    if isinstance(reference, str):
        return _reference_text(reference)  # a group shares its reference: parse it once
    if isinstance(reference, bool) or reference is None:
        raise ValueError(f"reference must be a GSM8K answer or a number, got {reference!r}")
    if isinstance(reference, (int, float)):
        return Fraction(reference)
    raise ValueError(f"reference must be a string or number, got {type(reference).__name__}")


@lru_cache(maxsize=4096)
def _reference_text(reference: str) -> Fraction:
    text = reference.rsplit("####", 1)[-1]
    value = parse_number(text)
    if value is None:
        raise ValueError(f"reference {text.strip()[:50]!r} is not a number (expected e.g. '#### 42' or '42')")
    return value


def equal(a: Fraction, b: Fraction) -> bool:
    return a == b or abs(a - b) <= Fraction(1, 10**9) * max(1, abs(b))


def score(completion: str, reference: Any, payload: dict | None = None) -> Score:
    ref = reference_number(reference)
    text, rule = extract_answer(completion)
    if text is None:
        return Score(0.0, {"format": rule})
    value = parse_number(text)
    if value is None:
        return Score(0.0, {"format": rule})
    return Score(1.0 if equal(value, ref) else 0.0, {"format": rule})
