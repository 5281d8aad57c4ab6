"""The customer-service reward, from the final database state and the agent's answers to the customer.

    1.0  every order ends in the status the policy requires, and the answers name the order
    0.5  the statuses are right, the answers never name the order
    0.0  any status is wrong: a refund or exchange the policy forbids (a violation), or one it required
         that was not made, or an action on an order before looking it up

`metrics`: violations (forbidden changes), missed (required changes not made), unchecked (changes made
without get_order first).
"""

from __future__ import annotations


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
    return (1.0 if order_id.lower() in (answer or "").lower() else 0.5), metrics
