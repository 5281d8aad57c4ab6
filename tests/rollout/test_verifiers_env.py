"""verifiers environments trained unmodified (rollout_service/environments/verifiers_env.py): episodes of the
example environments (examples/verifiers_env, single-turn and a vf.ToolEnv) through the real endpoint with a
scripted policy, whose reward is the environment rubric's own score of the recorded transcript; the data
command's rows, read the way the controller reads a dataset, give the adapter back the environment's rows;
clear errors; and a short `jetrl up` run of the tiny policy on the adapter, its trajectories carrying the
environment's rewards."""

from __future__ import annotations

import json
import re

import pytest
from agent_helpers import agent_config, client_for, endpoint
from ci_gate import need_module
from rollout_doubles import ScriptedEngine, char_tokenizer
from up_helpers import run_until_trained

from rollout_service.agents.runners import task_json
from rollout_service.agents.trajectory import episode_samples
from shared.contract.messages import PromptTask

vf = need_module("verifiers", "pip install 'verifiers==0.2.0' (or pip install -e '.[frameworks]')")

from controller.datasets import FieldMapping, resolve_mapping, to_payload  # noqa: E402
from rollout_service.environments import verifiers_data, verifiers_env  # noqa: E402
from shared.io.jsonl import json_objects  # noqa: E402

ENTRY = "rollout_service.environments.verifiers_env:run"
SINGLE, TOOLS = "examples.verifiers_env", "examples.verifiers_env.tools"
SMALL = {"num_train": 20, "num_eval": 5}
# SmolLM2-135M-Instruct's chat template (no tools: the endpoint puts its tool preamble in the system message)
SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def rows_of(env: str, env_args: dict, tmp_path, heldout: int = 2, limit: int = 0) -> list[dict]:
    """The data command's training rows, each as the controller makes it a task payload."""
    args = f"--env {env} --out {tmp_path} --heldout {heldout} --limit {limit}".split()
    verifiers_data.main([*args, "--env-args", json.dumps(env_args)])
    rows = [obj for _, obj in json_objects(tmp_path / "train.jsonl")]
    mapping = resolve_mapping(FieldMapping(), rows[0])
    payloads = [to_payload(r, mapping) for r in rows]
    assert all(err is None for _, err in payloads), payloads
    return [p for p, _ in payloads]


def addends(prompt: str) -> tuple[int, int]:
    a, b = re.findall(r"What is (\d+) \+ (\d+)\?", prompt)[-1]
    return int(a), int(b)


async def episode(env: str, env_args: dict, payload: dict, script, sampling_args: dict | None = None):
    """(reward the adapter returned, the session) of one episode through the endpoint."""
    tok = char_tokenizer(SMOL_TEMPLATE)
    cfg = agent_config(
        workflow="agent",
        sampling={"max_new_tokens": 80},
        workflow_args={"entry": ENTRY, "args": {"env": env, "env_args": env_args}},
    )
    async with endpoint(ScriptedEngine(tok, script), tok, cfg) as server:
        task = PromptTask(run="agents", prompt_id="p0", epoch=0, payload=payload)
        session = server.store.open(task, 0)
        client = client_for(server, session)
        reward = await verifiers_env.run(client, task_json(task), env, env_args, sampling_args)
    return reward, session


async def rubric_score(env: str, env_args: dict, payload: dict, completion: list) -> float:
    """The environment rubric's own score of `completion` (verifiers messages) for the task's row."""
    from verifiers.clients import OpenAIChatCompletionsClient

    environment = await verifiers_env.environment_for(env, env_args)
    state = await environment.init_state(
        verifiers_env.rollout_input(payload), OpenAIChatCompletionsClient(None), "policy"
    )
    state["completion"] = completion
    await environment.rubric.score_rollout(state)
    return state["reward"]


@pytest.mark.parametrize("right", [True, False])
async def test_single_turn_reward_is_the_rubrics_score_of_the_transcript(right, tmp_path):
    payload = rows_of(SINGLE, SMALL, tmp_path)[0]

    def script(prompt: str, n: int) -> str:
        a, b = addends(prompt)
        return f"{a + b if right else a + b + 1}<|im_end|>"

    reward, session = await episode(SINGLE, SMALL, payload, script)
    (call,) = session.calls
    assert reward == (1.0 if right else 0.0)
    transcript = [vf.AssistantMessage(content=call.reply["content"])]
    assert reward == await rubric_score(SINGLE, SMALL, payload, transcript)
    # the environment's prompt, as the data command wrote it
    assert [m["content"] for m in call.messages] == [m["content"] for m in payload["messages"]]


@pytest.mark.parametrize("right", [True, False])
async def test_tool_env_episode_calls_the_python_tool_and_merges_into_one_sample(right, tmp_path):
    payload = rows_of(TOOLS, SMALL, tmp_path)[0]
    a, b = addends(payload["messages"][-1]["content"])

    def script(prompt: str, n: int) -> str:
        results = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", prompt)
        if results:  # the tool's reply: answer with it (or a wrong number)
            return f"{int(results[-1]) + (0 if right else 1)}<|im_end|>"
        call = {"name": "add", "arguments": {"a": a, "b": b}}
        return f"<tool_call>{json.dumps(call)}</tool_call><|im_end|>"

    reward, session = await episode(TOOLS, SMALL, payload, script)
    assert reward == (1.0 if right else 0.0)
    first, second = session.calls
    assert first.tools[0]["function"]["name"] == first.reply["tool_calls"][0]["function"]["name"] == "add"
    # verifiers ran add and sent its result back as a tool message
    assert (second.messages[-1]["role"], second.messages[-1]["content"]) == ("tool", str(a + b))
    transcript = [vf.AssistantMessage(content=c.reply["content"]) for c in session.calls]
    assert reward == await rubric_score(TOOLS, SMALL, payload, transcript)
    (sample,) = episode_samples(session.calls, reward)  # the second call extends the first: one sample
    tok = char_tokenizer(SMOL_TEMPLATE)
    masked = tok.decode(sample.tokens[sample.loss_mask == 0].tolist(), skip_special_tokens=False)
    assert f"<|im_start|>tool\n{a + b}<|im_end|>" in masked  # the tool's reply is not trained on


async def test_data_rows_round_trip_to_the_environments_dataset(tmp_path):
    payloads = rows_of(SINGLE, SMALL, tmp_path, heldout=3, limit=7)
    environment = await verifiers_env.environment_for(SINGLE, SMALL)
    expected = [dict(r) for r in environment.get_dataset()][:7]
    assert [verifiers_env.rollout_input(p) for p in payloads] == expected
    assert [p["reference"] for p in payloads] == [r["answer"] for r in expected]
    assert payloads[0]["metadata"]["split"] == "train" and payloads[0]["metadata"]["verifiers_env"] == SINGLE
    held = [obj for _, obj in json_objects(tmp_path / "heldout.jsonl")]
    assert [h["metadata"]["verifiers"] for h in held] == [dict(r) for r in environment.get_eval_dataset()][:3]


def group_scored_env():
    """The single-turn example plus a group reward function (relative to the other rollouts): refused."""
    env = vf.load_environment(SINGLE, **SMALL)

    def relative(completions, answers) -> list[float]:
        return [0.0] * len(completions)

    env.rubric.add_reward_func(relative)
    return env


async def test_clear_errors_for_an_unknown_env_and_a_row_without_its_fields(tmp_path):
    with pytest.raises(
        verifiers_env.VerifiersEnvError,
        match="'no-such-env' is not installed: there is no module 'no_such_env'",
    ):
        await verifiers_env.run(None, {"prompt": "x"}, env="no-such-env")
    with pytest.raises(SystemExit, match="is not installed"):
        verifiers_data.main(["--env", "no-such-env", "--out", str(tmp_path)])
    with pytest.raises(
        verifiers_env.VerifiersEnvError, match="examples.verifiers_env has no attribute 'nope'"
    ):
        await verifiers_env.run(None, {"prompt": "x"}, env="examples.verifiers_env:nope")
    with pytest.raises(
        verifiers_env.VerifiersEnvError, match="task p3 has no metadata.verifiers .*verifiers_data --env"
    ):
        await verifiers_env.run(
            None,
            {"prompt_id": "p3", "prompt": "What is 1 + 2?", "reference": "3"},
            env=SINGLE,
            env_args=SMALL,
        )
    payload = rows_of(SINGLE, SMALL, tmp_path)[
        0
    ]  # the endpoint refuses a call: the episode fails, saying why
    with pytest.raises(
        verifiers_env.VerifiersEnvError, match="stopped on ModelError: BadRequestError: .*max_tokens"
    ):
        await episode(SINGLE, SMALL, payload, lambda p, n: "1", sampling_args={"max_tokens": 100_000})
    row = {"prompt_id": "p4", "metadata": {"verifiers": {"answer": "3", "info": {}}}}
    with pytest.raises(
        verifiers_env.VerifiersEnvError, match="task p4: metadata.verifiers lacks prompt, example_id"
    ):
        await verifiers_env.run(None, row, env=SINGLE, env_args=SMALL)


@pytest.mark.slow
async def test_jetrl_up_trains_the_tiny_policy_on_the_adapter_with_the_environments_rewards(tmp_path):
    from shared.config import JetrlConfig
    from shared.model.tinymodel import build_tokenizer

    # sums 0..4, and the policy writes one digit of 0..4: it is right about 1 time in 5
    env_args = {"num_train": 6, "num_eval": 3, "low": 0, "high": 2}
    payloads = {
        p["metadata"]["verifiers"]["question"]: p for p in rows_of(SINGLE, env_args, tmp_path / "data", 0)
    }
    tok = build_tokenizer()
    cfg = JetrlConfig.model_validate(
        {
            "run": "vfenv",
            "nats": {"embedded": True},
            "telemetry": {"events_interval_s": 1.0},
            "schedule": {"max_staleness": 2, "batch_size": 2, "total_steps": 2},
            "reward": {"task": "exact"},
            "rollout": {
                "workflow": "agent",
                "group_size": 4,
                "max_in_flight": 2,
                "agent": {"timeout_s": 60},
                "workflow_args": {"entry": ENTRY, "args": {"env": SINGLE, "env_args": env_args}},
                "sampling": {
                    "max_new_tokens": 1,
                    "allowed_token_ids": tok.convert_tokens_to_ids(list("01234")),
                },
            },
        }
    )
    snap, ledger, page = await run_until_trained(cfg, tmp_path / "run", tmp_path / "data" / "train.jsonl",
                                                 timeout_s=240, rollouts=100)
    assert len(snap["steps"]) >= 2 and ledger["trained"] >= 2 * 2 and int(ledger.get("dead_lettered", 0)) == 0
    samples = [(s, g) for g in page["items"] for s in g["samples"]]
    assert len(samples) >= 2 * 2 * 4
    for s, g in samples:  # each sample's reward is the environment rubric's score of what the policy wrote
        question = next(q for q in payloads if q in s["prompt"])
        (reply,) = [seg["text"] for seg in s["segments"] if seg["kind"] == "policy"]
        expected = await rubric_score(
            SINGLE, env_args, payloads[question], [vf.AssistantMessage(content=reply)]
        )
        assert (s["reward"], s["metrics"]["reward_source"]) == (expected, "agent"), (g["prompt_id"], s)
    print("REWARDS", sorted(s["reward"] for s, _ in samples))
    log = (tmp_path / "run" / "logs" / "rollout.log").read_text()
    assert "did not stop" not in log  # the environment's own SIGTERM handler was not installed in the worker
