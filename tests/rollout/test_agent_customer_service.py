"""The customer-service agent example (examples/agents/customer_service): its reward on hand-made outcomes
(right, wrong, policy violation, acting without a look-up), its generated tasks, and one episode end to end
through the endpoint with a scripted policy that looks the order up, refunds it and tells the customer."""

from __future__ import annotations

import json
import random
import re

import pytest
from agent_helpers import agent_config, client_for, endpoint
from rollout_doubles import QWEN_LIKE_TEMPLATE, ScriptedEngine, char_tokenizer

from examples.agents.customer_service import agent
from examples.agents.customer_service.data import make_task
from examples.agents.customer_service.reward import score_episode
from examples.agents.customer_service.shop import Shop
from rollout_service.agents.trajectory import episode_samples
from shared.contract.messages import PromptTask

ORDERS = {"A1": {"item": "blue mug", "status": "delivered", "days_since_delivery": 3},
          "B2": {"item": "notebook", "status": "shipped", "days_since_delivery": None}}
EXPECT_A1 = {"A1": "refunded", "B2": "shipped"}  # "refund A1": allowed


def outcome(*calls: tuple[str, dict]) -> Shop:
    shop = Shop(ORDERS)
    for name, args in calls:
        shop.call(name, json.dumps(args))
    return shop


@pytest.mark.parametrize(("calls", "said", "reward", "metric"), [
    ([("get_order", {"order_id": "A1"}), ("refund", {"order_id": "A1"})], "Order A1 is refunded.", 1.0, None),
    ([("get_order", {"order_id": "A1"}), ("refund", {"order_id": "A1"})], "Done!", 0.5, None),
    ([("get_order", {"order_id": "A1"})], "Sorry, A1 cannot be refunded.", 0.0, "missed"),  # wrong: refused
    ([("get_order", {"order_id": "A1"}), ("refund", {"order_id": "A1"}), ("get_order", {"order_id": "B2"}),
      ("refund", {"order_id": "B2"})], "A1 and B2 refunded", 0.0, "violations"),  # B2 is only shipped
    ([("refund", {"order_id": "A1"})], "A1 refunded", 0.0, "unchecked"),  # acted without looking it up
])
def test_reward_on_hand_made_outcomes(calls, said, reward, metric):
    shop = outcome(*calls)
    got, metrics = score_episode(shop.statuses(), EXPECT_A1, shop.actions, shop.looked_up, said, "A1")
    assert got == reward
    if metric:
        assert metrics[metric] == 1


def test_generated_tasks_follow_the_policy():
    rng = random.Random(0)
    for _ in range(200):
        t = make_task(rng)
        oid = t["reference"]["order_id"]
        o = t["metadata"]["orders"][oid]
        allowed = o["status"] == "delivered" and o["days_since_delivery"] <= 30
        assert (t["reference"]["statuses"][oid] in ("refunded", "exchanged")) == allowed
        assert oid in t["prompt"]


def scripted_clerk(prompt: str, n: int) -> str:
    """Looks the order up, refunds it, tells the customer; then answers politely."""
    oid = re.search(r"order (A\d+)", prompt).group(1)
    responses = prompt.count("<tool_response>")
    if responses == 0:
        return '<tool_call>{"name": "get_order", "arguments": {"order_id": "' + oid + '"}}</tool_call><|im_end|>'
    if responses == 1:
        return '<tool_call>{"name": "refund", "arguments": {"order_id": "' + oid + '"}}</tool_call><|im_end|>'
    return f"Your order {oid} is refunded.<|im_end|>"


async def test_one_customer_service_episode_end_to_end_through_the_endpoint():
    task = {"prompt": "Hi, I would like a refund for order A1, the blue mug.",
            "reference": {"statuses": EXPECT_A1, "order_id": "A1"},
            "metadata": {"orders": ORDERS, "user_turns": ["Thanks, that is all."]}}
    tok = char_tokenizer(QWEN_LIKE_TEMPLATE)
    async with endpoint(ScriptedEngine(tok, scripted_clerk), tok, agent_config(agent={"max_tokens": 200})) as server:
        session = server.store.open(PromptTask(run="agents", prompt_id="c0", epoch=0, payload=task), 0)
        reward = await agent.run(client_for(server, session), task)
    assert reward == 1.0, [c.text for c in session.calls]
    assert len(session.calls) == 4  # look-up, refund, message, message after the customer's reply
    (sample,) = episode_samples(session.calls, reward)
    masked = tok.decode(sample.tokens[sample.loss_mask == 0].tolist(), skip_special_tokens=False)
    assert "order A1 refunded" in masked and "Thanks, that is all." in masked  # tool result, customer: masked


@pytest.mark.parametrize("argv", [
    ["-m", "examples.agents.customer_service.data"],  # as its README and configs say (it imports examples.*)
    ["examples/agents/search/data.py"],
    ["examples/agents/calculator/data.py"],
    ["examples/agents/chain/data.py"],
    ["examples/addition/data.py"],
])
def test_the_documented_data_commands_run_from_the_repository_root(argv, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, *argv, "--out", str(tmp_path / "data")], cwd=root, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "data" / "train.jsonl").stat().st_size > 0
    assert (tmp_path / "data" / "heldout.jsonl").stat().st_size > 0
