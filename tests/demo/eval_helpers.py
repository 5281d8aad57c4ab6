"""What `jetrl eval` must reproduce: the greedy maxdigit reward of a model, decoded directly."""

import torch

from reward_service.scorers.maxdigit import score


def direct_greedy_reward(model, tok, rows: list[dict]) -> float:
    """Mean maxdigit reward of the model's greedy next token on each row (the demo answers in one token)."""
    model.eval()
    total = 0.0
    with torch.no_grad():
        for r in rows:
            ids = torch.tensor([tok.encode(r["prompt"], add_special_tokens=False)])
            nxt = int(model(ids).logits[0, -1].argmax())
            total += score(tok.decode([nxt]), r["reference"]).reward
    return total / len(rows)
