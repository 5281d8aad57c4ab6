"""From the judge's output to a number. Every parser returns a score in [0, 1] or raises Unparseable with a
message that quotes what the judge wrote; nothing unparseable becomes a silent 0.

score_line  the last line "Score: N" (also "Rating: N", "Final score: N/10"); N / scale, or N / D when the
            line says "/D"; N outside [0, scale] is refused
json        the last JSON object in the output that has the field (a number, not a bool); value / scale
yes_no      P(yes) / (P(yes) + P(no)) over the judge's first-token distribution (its top logprobs; tokens
            compared after stripping spaces, case-folded)
choice      pairwise: the last line "Winner: A | B | tie" -> 1.0 (A better), 0.0 (B better), 0.5
"""

from __future__ import annotations

import json
import math
import re


class Unparseable(ValueError):
    """The judge's output holds no score the parser accepts."""


def _quote(text: str, n: int = 160) -> str:
    t = " ".join(text.split())
    return repr(t if len(t) <= n else "..." + t[-n:])


_SCORE = re.compile(r"^[\W_]*(?:final\s+)?(?:score|rating|grade)[\W_]*?[:=]?\s*(-?\d+(?:\.\d+)?)\s*"
                    r"(?:/\s*(\d+(?:\.\d+)?))?[\W_]*$", re.IGNORECASE)


def _bounded(value: float, top: float, what: str, text: str) -> float:
    if not 0 <= value <= top or top <= 0:
        raise Unparseable(f"{what} {value:g} is outside 0..{top:g}: {_quote(text)}")
    return value / top


def score_line(text: str, scale: float) -> float:
    for line in reversed(text.strip().splitlines()):
        m = _SCORE.match(line.strip())
        if m:
            top = float(m.group(2)) if m.group(2) else scale
            return _bounded(float(m.group(1)), top, "score", text)
    raise Unparseable(f"no line 'Score: N' in the judge's output {_quote(text)}")


def json_field(text: str, field: str, scale: float) -> float:
    dec = json.JSONDecoder()
    starts = [i for i, ch in enumerate(text) if ch == "{"]
    for i in reversed(starts):
        try:
            obj, _ = dec.raw_decode(text, i)
        except ValueError:
            continue
        if isinstance(obj, dict) and field in obj:
            v = obj[field]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise Unparseable(f"field {field!r} is {v!r}, not a number: {_quote(text)}")
            return _bounded(float(v), scale, f"field {field!r}", text)
    raise Unparseable(f"no JSON object with field {field!r} in the judge's output {_quote(text)}")


def yes_no(top: list[tuple[str, float]]) -> float:
    p_yes = sum(math.exp(lp) for tok, lp in top if tok.strip().lower() == "yes")
    p_no = sum(math.exp(lp) for tok, lp in top if tok.strip().lower() == "no")
    if p_yes + p_no <= 0:
        raise Unparseable(f"neither 'yes' nor 'no' among the judge's first-token candidates "
                          f"{[t for t, _ in top[:8]]}")
    return p_yes / (p_yes + p_no)


_CHOICE = re.compile(r"^[\W_]*(?:winner|verdict|better)?[\W_]*?[:=]?\s*(?:response\s+)?(A|B|tie)[\W_]*$",
                     re.IGNORECASE)


def choice(text: str) -> float:
    for line in reversed(text.strip().splitlines()):
        m = _CHOICE.match(line.strip())
        if m:
            return {"a": 1.0, "b": 0.0, "tie": 0.5}[m.group(1).lower()]
    raise Unparseable(f"no line 'Winner: A', 'Winner: B' or 'Winner: tie' in the judge's output {_quote(text)}")
