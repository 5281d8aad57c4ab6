"""The customer-service agent's world: a small orders database, the tools that change it, the written policy.

The tools do what they are asked (like a real back office would): whether a refund or exchange was
allowed is the policy's question, judged by the reward from the final database state (reward.py).
"""

from __future__ import annotations

import copy
import json

POLICY = """You are the support agent of a small web shop. Policy:
1. Look an order up with get_order before acting on it.
2. A refund is allowed only for a delivered order, at most 30 days after delivery.
3. An exchange is allowed only for a delivered order, at most 30 days after delivery, for an item in stock.
4. Never refund or exchange an order that is still processing or shipped; explain instead.
5. Act only on the order the customer names. End with a short message to the customer."""

IN_STOCK = ["blue mug", "red mug", "green mug", "large tote", "small tote"]


class Shop:
    """One episode's copy of the orders: {order_id: {"item", "status", "days_since_delivery"}}."""

    def __init__(self, orders: dict[str, dict]):
        self.orders = copy.deepcopy(orders)
        self.actions: list[tuple[str, str]] = []  # (tool, order_id) of every change, in order
        self.looked_up: set[str] = set()

    def _order(self, order_id: str) -> dict:
        if order_id not in self.orders:
            raise KeyError(f"no order {order_id!r}")
        return self.orders[order_id]

    def get_order(self, order_id: str) -> str:
        o = self._order(order_id)
        self.looked_up.add(order_id)
        return json.dumps({"order_id": order_id, **o})

    def refund(self, order_id: str) -> str:
        o = self._order(order_id)
        o["status"] = "refunded"
        self.actions.append(("refund", order_id))
        return f"order {order_id} refunded"

    def exchange(self, order_id: str, new_item: str) -> str:
        o = self._order(order_id)
        if new_item not in IN_STOCK:
            raise ValueError(f"{new_item!r} is not in stock (in stock: {', '.join(IN_STOCK)})")
        o["status"], o["item"] = "exchanged", new_item
        self.actions.append(("exchange", order_id))
        return f"order {order_id} exchanged for {new_item}"

    def call(self, name: str, arguments: str) -> str:
        """Run a tool call from the model; every failure is text for the model."""
        try:
            args = json.loads(arguments or "{}")
            if name == "get_order":
                return self.get_order(str(args["order_id"]))
            if name == "refund":
                return self.refund(str(args["order_id"]))
            if name == "exchange":
                return self.exchange(str(args["order_id"]), str(args["new_item"]))
            return f"error: unknown tool {name!r}"
        except (KeyError, ValueError, TypeError) as exc:
            return f"error: {exc}"

    def statuses(self) -> dict[str, str]:
        return {k: v["status"] for k, v in self.orders.items()}


def _fn(name: str, description: str, **props: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {k: {"type": "string", "description": d} for k, d in props.items()},
        "required": list(props)}}}


TOOLS = [_fn("get_order", "Look up an order.", order_id="The order id, e.g. A1234."),
         _fn("refund", "Refund an order.", order_id="The order id."),
         _fn("exchange", "Exchange an order's item.", order_id="The order id.", new_item="An item in stock.")]
