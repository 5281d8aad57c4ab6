"""Pairwise preference within a group (pure functions).

A group is what GRPO compares, so the judge compares its completions with each other and each one's
reward is its win rate: over every comparison it took part in, 1 for a win, 0.5 for a tie, 0 for a loss,
averaged. Judged in both orders (the default), a pair contributes two comparisons, so a judge that always
prefers the first position gives both completions 0.5 from that pair instead of a made-up winner.
"""

from __future__ import annotations


def schedule(n: int, max_opponents: int = 0, both_orders: bool = True) -> list[tuple[int, int]]:
    """Ordered pairs (a, b) to judge, a shown as A. Every unordered pair (max_opponents 0), or each i with
    the next max_opponents indices round-robin (i+1, i+2, ... mod n); each pair once per order asked."""
    if n < 2:
        return []
    k = n - 1 if not max_opponents else min(max_opponents, n - 1)
    pairs = sorted({(min(i, (i + d) % n), max(i, (i + d) % n)) for i in range(n) for d in range(1, k + 1)})
    return [p for a, b in pairs for p in (((a, b), (b, a)) if both_orders else ((a, b),))]


def win_rates(n: int, verdicts: dict[tuple[int, int], float]) -> tuple[list[float], list[int]]:
    """(win rate, comparisons) per completion from verdicts {(a, b): 1.0 a better, 0.0 b better, 0.5 tie}.
    A completion in no comparison (a group of one) gets 0.5."""
    won = [0.0] * n
    seen = [0] * n
    for (a, b), v in verdicts.items():
        won[a] += v
        won[b] += 1.0 - v
        seen[a] += 1
        seen[b] += 1
    return [w / c if c else 0.5 for w, c in zip(won, seen, strict=True)], seen
