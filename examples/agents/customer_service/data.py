"""Generated customer-service tasks (synthetic: no third-party data). Each task: a customer's orders, the
request they make about one of them, and what the policy requires the final statuses to be.

    python -m examples.agents.customer_service.data --out cs-data     # train.jsonl, heldout.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from examples.agents.customer_service.shop import IN_STOCK

ITEMS = ["blue mug", "red mug", "large tote", "desk lamp", "notebook"]


def make_task(rng: random.Random) -> dict:
    orders = {}
    for _ in range(rng.randint(2, 3)):
        oid = f"A{rng.randint(1000, 9999)}"
        status = rng.choice(["delivered", "delivered", "shipped", "processing"])
        orders[oid] = {"item": rng.choice(ITEMS), "status": status,
                       "days_since_delivery": rng.randint(1, 60) if status == "delivered" else None}
    oid = rng.choice(sorted(orders))
    o = orders[oid]
    want = rng.choice(["refund", "exchange"])
    new_item = rng.choice(IN_STOCK)
    allowed = o["status"] == "delivered" and o["days_since_delivery"] <= 30
    expected = {k: v["status"] for k, v in orders.items()}
    if allowed:
        expected[oid] = "refunded" if want == "refund" else "exchanged"
    ask = (f"Hi, I would like a refund for order {oid}, the {o['item']}." if want == "refund" else
           f"Hi, can I exchange the {o['item']} of order {oid} for a {new_item}?")
    return {"prompt": ask, "reference": {"statuses": expected, "order_id": oid},
            "metadata": {"orders": orders, "user_turns": [f"The order id is {oid}.", "Thanks, that is all."]}}


def write(out: str | Path, seed: int = 0, train: int = 400, heldout: int = 50) -> dict[str, Path]:
    rng = random.Random(seed)
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    paths = {"train": d / "train.jsonl", "heldout": d / "heldout.jsonl"}
    for name, n in (("train", train), ("heldout", heldout)):
        paths[name].write_text("".join(json.dumps(make_task(rng)) + "\n" for _ in range(n)))
    return paths


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="cs-data")
    ap.add_argument("--seed", type=int, default=0)
    for name, path in write(ap.parse_args().out, ap.parse_args().seed).items():
        print(f"{name}: {path}")
