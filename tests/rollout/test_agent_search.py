"""The search agent example (examples/agents/search): its generated data answer every question in two hops,
its reward on hand-made answers, and one episode end to end through the endpoint (a scripted policy that
searches for the person, then the town, then answers), merged into one sample."""

from __future__ import annotations

import json
import re

import pytest
from agent_helpers import agent_config, client_for, endpoint
from rollout_doubles import QWEN_LIKE_TEMPLATE, ScriptedEngine, char_tokenizer

from examples.agents.search import agent
from examples.agents.search.data import make_world, write
from examples.agents.search.reward import episode_reward, score_answer
from rollout_service.agents.trajectory import episode_samples
from shared.contract.messages import PromptTask


def test_every_question_is_answered_by_two_passages_of_the_corpus():
    passages, questions = make_world(seed=3)
    texts = {p["text"] for p in passages}
    assert len(questions) == 300 and len({q["prompt"] for q in questions}) == 300
    for q in questions:
        person, town = q["metadata"]["person"], q["metadata"]["town"]
        assert f"{person} was born in {town}." in texts and f"{town} is a town in {q['reference']}." in texts
    assert make_world(seed=3) == (passages, questions)  # deterministic


@pytest.mark.parametrize(("text", "reward", "answered"), [
    ("Mira was born in Belwick, which is in Caldoria.\nAnswer: Caldoria", 1.0, 1),
    ("answer: caldoria.", 1.0, 1),
    ("Answer: Belmoria", 0.0, 1),  # wrong country
    ("Caldoria", 0.0, 0),  # right name, but not in the required form
    ("Answer: Belwick", 0.0, 1),  # stopped at the first hop: the town, not the country
    ("", 0.0, 0),  # ran out of turns while searching
])
def test_reward_on_hand_made_answers(text, reward, answered):
    assert score_answer(text, "Caldoria") == (reward, {"answered": answered})


@pytest.mark.parametrize(("final", "found", "reward"), [
    ("Answer: Caldoria", 0, 1.0),  # right without a search that found anything: still right
    ("Answer: Caldoria", 2, 1.0),
    ("Answer: Belmoria", 0, 0.0),  # wrong, no search found passages
    ("Answer: Belwick", 1, 0.1),  # one hop searched, answered the town
    ("", 2, 0.2),  # searched both hops, ran out of turns
    ("Answer: Belmoria", 3, 0.2),  # the credit stops at two searches
])
def test_episode_reward_gives_partial_credit_for_searches_that_found_passages(final, found, reward):
    assert episode_reward(final, "Caldoria", found) == pytest.approx(reward)


def scripted_searcher(prompt: str, n: int) -> str:
    """Searches for the person, then for the town it read, then answers with the country it read (of the
    last question: the worked example before it has its own searches)."""
    prompt = prompt[prompt.rindex("In which country was"):]
    responses = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", prompt, re.DOTALL)
    if not responses:
        person = re.search(r"was (.+) born\?", prompt).group(1)
        query = person
    elif len(responses) == 1:
        query = re.search(r"born in (\w+)\.", responses[0]).group(1) + " town"
    else:
        return "Answer: " + re.search(r"is a town in (\w+)\.", responses[1]).group(1) + "<|im_end|>"
    return '<tool_call>{"name": "search", "arguments": {"query": "' + query + '"}}</tool_call><|im_end|>'


async def test_one_search_episode_end_to_end_through_the_endpoint(tmp_path):
    paths = write(tmp_path / "data", seed=0, heldout=5)
    row = json.loads(paths["heldout"].read_text().splitlines()[0])
    tok = char_tokenizer(QWEN_LIKE_TEMPLATE)
    async with endpoint(ScriptedEngine(tok, scripted_searcher), tok, agent_config(agent={"max_tokens": 200})) as server:
        task = PromptTask(run="agents", prompt_id="q0", epoch=0, payload=row)
        session = server.store.open(task, 0)
        reward = await agent.run(client_for(server, session), {"prompt_id": "q0", **row})
    assert reward == 1.0, [c.text for c in session.calls]
    assert len(session.calls) == 3
    (sample,) = episode_samples(session.calls, reward)
    text = tok.decode(sample.tokens[sample.loss_mask == 0].tolist(), skip_special_tokens=False)
    # the worked example's two search results and the episode's own two: in the prompt, masked
    assert text.count("<tool_response>") == 4 and row["metadata"]["town"] in text
    policy = tok.decode(sample.tokens[sample.loss_mask == 1].tolist(), skip_special_tokens=False)
    assert policy.count("<tool_call>") == 2 and policy.endswith(f"Answer: {row['reference']}<|im_end|>")
