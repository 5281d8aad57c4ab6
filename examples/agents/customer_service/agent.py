"""A τ-bench-style customer-service agent written against the openai client only (docs/agents.md).

    rollout:
      workflow: agent
      workflow_args: {entry: "examples.agents.customer_service.agent:run"}

The policy model talks to a scripted customer (the task's user turns) and may call get_order, refund and
exchange on the episode's own copy of the orders (shop.py); the written policy is its system message.
A model turn without tool calls is a message to the customer, who answers with the next scripted line;
after the last one the episode ends and the reward (reward.py) is computed from the final statuses and
what the agent told the customer.
"""

from __future__ import annotations

from examples.agents.customer_service.reward import score_episode
from examples.agents.customer_service.shop import POLICY, TOOLS, Shop

MAX_MODEL_TURNS = 8


async def run(client, task) -> float:
    shop = Shop(task["metadata"]["orders"])
    user_turns = list(task["metadata"]["user_turns"])
    msgs = [{"role": "system", "content": POLICY}, {"role": "user", "content": task["prompt"]}]
    said: list[str] = []  # the agent's messages to the customer
    for _ in range(MAX_MODEL_TURNS):
        r = await client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS)
        m = r.choices[0].message
        msgs.append(m.model_dump(exclude_none=True))
        if m.tool_calls:
            for tc in m.tool_calls:
                msgs.append({"role": "tool", "tool_call_id": tc.id,
                             "content": shop.call(tc.function.name, tc.function.arguments)})
            continue
        said.append(m.content or "")
        if not user_turns:
            break
        msgs.append({"role": "user", "content": user_turns.pop(0)})
    ref = task["reference"]
    reward, _ = score_episode(shop.statuses(), ref["statuses"], shop.actions, shop.looked_up, "\n".join(said),
                              ref["order_id"])
    return reward
