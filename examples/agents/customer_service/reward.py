"""The customer-service reward, from the final database state and the agent's answers to the customer.

    1.0  every order ends in the status the policy requires, and the answers name the order (as a whole
         word, and none of the customer's other orders: listing every id is not naming the order)
    0.5  the statuses are right, the answers do not name the order alone
    0.0  any status is wrong: a refund or exchange the policy forbids (a violation), or one it required
         that was not made, or an action on an order before looking it up

`metrics`: violations (forbidden changes), missed (required changes not made), unchecked (changes made
without get_order first).
"""

from __future__ import annotations

import re


def _named(order_id: str, text: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(order_id)}(?![A-Za-z0-9])", text, re.IGNORECASE) is not None


def score_episode(final: dict[str, str], expected: dict[str, str], actions: list[tuple[str, str]],
                  looked_up: set[str], answer: str, order_id: str) -> tuple[float, dict]:
    changed = {k for k, v in final.items() if v in ("refunded", "exchanged")}
    required = {k for k, v in expected.items() if v in ("refunded", "exchanged")}
    violations = len([k for k in changed if final[k] != expected.get(k)])
    missed = len([k for k in required if final.get(k) != expected[k]])
    unchecked = len([o for _, o in actions if o not in looked_up])
    metrics = {"violations": violations, "missed": missed, "unchecked": unchecked, "actions": len(actions)}
    if violations or missed or unchecked:
        return 0.0, metrics
    answer = answer or ""
    others = [k for k in final if k != order_id and _named(k, answer)]
    return (1.0 if _named(order_id, answer) and not others else 0.5), metrics
