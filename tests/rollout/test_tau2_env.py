"""The τ²-bench adapter (rollout_service/environments/tau2_env.py) against the real τ²-bench, offline: simulations
of its `mock` domain's tasks (and one retail task for the NL-assertion judge) through the real endpoint with a
scripted policy. The adapter's reward equals τ²-bench's own evaluator's score of the same simulation, right
(1.0) and wrong (lower); the policy's tool calls run in τ²-bench's environment; the user is the scripted one,
τ²-bench's own LLM UserSimulator (litellm) talking to another endpoint session, or τ²-bench's solo mode; the
entry runs under both entry transports; the data command's rows, read as the controller reads a dataset, are
τ²-bench's tasks; and the errors say what is wrong.

τ²-bench is not on PyPI (PyPI's `tau2` is an unrelated package) and jetrl's CI installs from package
registries only, so this is the one test module allowed to skip in CI: it runs only where τ²-bench is
installed from its git repository (docs/environments.md, "τ²-bench"). No `jetrl up` test: the tiny test
policies (character-level, 256 or 1024 positions) cannot take τ²-bench's prompts (the agent's first prompt on
mock is ~960 characters with this test's template, which names the tools only; more with the tool schemas),
so a launcher run would only show episodes refused for their length."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading

import pytest

with contextlib.suppress(ImportError):  # first: it points τ²-bench at its clone's data/ before tau2 is imported
    import rollout_service.environments.tau2_env  # noqa: F401
pytest.importorskip("tau2.orchestrator.orchestrator",
                    reason="τ²-bench is not on PyPI: pip install from github.com/sierra-research/tau2-bench")

from agent_helpers import agent_config, client_for, endpoint  # noqa: E402
from rollout_doubles import QWEN_LIKE_TEMPLATE, ScriptedEngine, char_tokenizer  # noqa: E402
from tau2.data_model.simulation import TerminationReason  # noqa: E402
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation  # noqa: E402
from tau2.registry import registry  # noqa: E402
from tau2.runner.build import build_environment  # noqa: E402

from controller.datasets import FieldMapping, resolve_mapping, to_payload  # noqa: E402
from rollout_service.agents.runners import EntryRunner, task_json  # noqa: E402
from rollout_service.agents.trajectory import episode_samples  # noqa: E402
from rollout_service.environments import tau2_data, tau2_env  # noqa: E402
from rollout_service.environments.tau2_env import Tau2EnvError  # noqa: E402
from shared.contract.messages import PromptTask  # noqa: E402
from shared.io.jsonl import json_objects  # noqa: E402

ENTRY = "rollout_service.environments.tau2_env:run"
MEETING = {"user_id": "user_1", "title": "Important Meeting"}


def call(name: str, arguments: dict) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call><|im_end|>"


def last_turn(prompt: str) -> str:
    """What the policy answers: the last message of the rendered chat (QWEN_LIKE_TEMPLATE)."""
    return prompt.rsplit("<|im_start|>", 2)[-2]


def agent_script(arguments: dict, tool: str = "create_task"):
    """The agent: calls `tool` once, then tells the user it is done."""

    def script(prompt: str, n: int) -> str:
        if "<tool_response>" in last_turn(prompt):
            return "Done: your task is created.<|im_end|>"
        return call(tool, arguments)

    return script


def payload_for(task_id: str, domain: str = "mock", **tau2) -> dict:
    return {"prompt": f"{domain} {task_id}", "reference": "",
            "metadata": {"tau2": {"domain": domain, "task_id": task_id, **tau2}}}


def task_of(domain: str, task_id: str):
    return next(t for t in registry.get_tasks_loader(domain)() if t.id == task_id)


async def episode(payload: dict, script, engine_class=ScriptedEngine, **args):
    """(τ²-bench's SimulationRun, the agent's session, the engine) of one simulation; an argument that is a
    function is called with the server first."""
    tok = char_tokenizer(QWEN_LIKE_TEMPLATE)
    engine = engine_class(tok, script)
    cfg = agent_config(workflow="agent", sampling={"max_new_tokens": 240})
    async with endpoint(engine, tok, cfg) as server:
        task = PromptTask(run="agents", prompt_id="p0", epoch=0, payload=payload)
        session = server.store.open(task, 0)
        extra = {k: v(server) if callable(v) else v for k, v in args.items()}
        sim = await tau2_env.simulate(client_for(server, session), task_json(task), **extra)
    return sim, session, engine


def own_evaluation(sim, domain: str, task_id: str, solo: bool = False):
    """τ²-bench's evaluator on the simulation the adapter played (a fresh copy of the task)."""
    return evaluate_simulation(simulation=sim, task=task_of(domain, task_id), evaluation_type=EvaluationType.ALL,
                               solo_mode=solo, domain=domain)


@pytest.mark.parametrize("right", [True, False])
async def test_scripted_user_episode_scores_taus_own_evaluation(right):
    arguments = MEETING if right else {**MEETING, "title": "Unimportant Meeting"}
    sim, session, _ = await episode(payload_for("create_task_1"), agent_script(arguments), domain="mock",
                                    user="scripted")
    assert sim.termination_reason == TerminationReason.USER_STOP
    assert sim.reward_info.reward == own_evaluation(sim, "mock", "create_task_1").reward == (1.0 if right else 0.0)
    assert sim.reward_info.db_check.db_match is right
    roles = [m.role for m in sim.messages]
    assert roles == ["assistant", "user", "assistant", "tool", "assistant", "user"]
    assert sim.messages[1].content == task_of("mock", "create_task_1").ticket  # the scripted user's line
    assert sim.messages[-1].content == "###STOP###"
    # the policy's tool call ran in τ²-bench's mock environment: its result is the created task
    assert json.loads(sim.messages[3].content) == {"task_id": "task_2", "title": arguments["title"],
                                                   "description": None, "status": "pending"}
    first, second = session.calls
    env = build_environment("mock")
    assert first.tools == [t.openai_schema for t in env.get_tools()]
    assert env.get_policy() in first.messages[0]["content"]  # τ²-bench's LLMAgent system prompt
    assert first.reply["tool_calls"][0]["function"]["name"] == "create_task"
    assert second.messages[-1]["role"] == "tool" and second.messages[-1]["content"] == sim.messages[3].content
    (sample,) = episode_samples(session.calls, sim.reward_info.reward)  # the conversation is one sample
    assert sample.reward == sim.reward_info.reward


@pytest.mark.parametrize("transport", ["in_process", "http"])
async def test_entry_runner_runs_the_adapter_on_both_transports(transport):
    tok = char_tokenizer(QWEN_LIKE_TEMPLATE)
    cfg = agent_config(workflow="agent", sampling={"max_new_tokens": 240}, agent={"entry_transport": transport})
    runner = EntryRunner(ENTRY, {"domain": "mock", "user": "scripted"})
    async with endpoint(ScriptedEngine(tok, agent_script(MEETING)), tok, cfg) as server:
        assert (server.store.app is not None) is (transport == "in_process")
        task = PromptTask(run="agents", prompt_id="p0", epoch=0, payload=payload_for("create_task_1"))
        session = server.store.open(task, 0)
        try:
            assert await runner(session, server.store) == 1.0
        finally:
            await runner.close()
    assert len(session.calls) == 2


async def test_history_task_and_a_row_script_for_the_scripted_user():
    """A task whose initial state has a conversation (τ²-bench replays it), the user's lines from the row."""
    lines = ["Please mark task_2 as completed.", "Thanks, that is all."]
    sim, session, _ = await episode(payload_for("update_task_with_message_history", user_script=lines),
                                    agent_script({"task_id": "task_2", "status": "completed"},
                                                 "update_task_status"),
                                    domain="mock", user="scripted")
    assert [m.content for m in sim.messages if m.role == "user"][1:] == [*lines, "###STOP###"]
    assert sim.reward_info.reward == own_evaluation(sim, "mock", "update_task_with_message_history").reward == 1.0
    # the agent's first call carries the task's earlier conversation, as τ²-bench replays it
    assert any("created a task titled 'Project Review'" in (m["content"] or "") for m in session.calls[0].messages)


async def test_llm_user_is_taus_user_simulator_through_litellm(tmp_path):
    """user: llm — τ²-bench's UserSimulator (its guidelines and the task's scenario) calls an OpenAI-compatible
    server through litellm: here another session of the same endpoint, whose scripted replies play the user."""
    said = []

    def script(prompt: str, n: int) -> str:
        if "<scenario>" in prompt:  # τ²-bench's user simulator prompt
            said.append(prompt)
            if "<tool_response>" in last_turn(prompt) or "Done" in last_turn(prompt):
                return "Thank you! ###STOP###<|im_end|>"
            return "Hi, please create a task called 'Important Meeting' for user_1.<|im_end|>"
        return agent_script(MEETING)(prompt, n)

    user = {}

    def user_url(server):
        s = server.store.open(PromptTask(run="agents", prompt_id="u", epoch=0, payload={"prompt": "user"}), 1)
        user["session"] = s
        return server.store.url(s)

    def key_file(server):  # evaluated after user_url
        (tmp_path / "user.key").write_text(user["session"].key + "\n")
        return str(tmp_path / "user.key")

    sim, session, _ = await episode(payload_for("create_task_1"), script, domain="mock", user="llm",
                                    user_model="user-sim", user_base_url=user_url, user_api_key_file=key_file)
    assert sim.termination_reason == TerminationReason.USER_STOP
    assert sim.reward_info.reward == own_evaluation(sim, "mock", "create_task_1").reward == 1.0
    assert len(said) == 2 and "Create a new task called 'Important Meeting' for user_1" in said[0]
    assert len(user["session"].calls) == 2 and len(session.calls) == 2  # the user's calls in its own session
    assert [m.content for m in sim.messages if m.role == "user"][0].startswith("Hi, please create")


class GrammarScriptedEngine(ScriptedEngine):
    """The scripted engine, taking the endpoint's grammar constraints (the scripts' tool calls satisfy them): what
    `tool_choice: required` asks of an engine (the `local` engine enforces it; the scripted one refuses it)."""

    constraint_kinds = ("lark",)

    async def generate(self, req):
        self.constraints = [*getattr(self, "constraints", []), req.sampling.constraint]
        return await super().generate(req)


@pytest.mark.parametrize("right", [True, False])
async def test_solo_mode_is_taus_solo_agent_with_the_done_tool(right):
    def script(prompt: str, n: int) -> str:
        if "<tool_response>" in last_turn(prompt):
            return call("done", {})
        return call("create_task", MEETING if right else {**MEETING, "title": "Other"})

    sim, session, engine = await episode(payload_for("create_task_1"), script, GrammarScriptedEngine,
                                         domain="mock", user="solo")
    assert sim.termination_reason == TerminationReason.AGENT_STOP
    assert sim.reward_info.reward == own_evaluation(sim, "mock", "create_task_1", solo=True).reward
    assert sim.reward_info.reward == (1.0 if right else 0.0)
    assert task_of("mock", "create_task_1").ticket in session.calls[0].messages[0]["content"]
    names = {t["function"]["name"] for t in session.calls[0].tools}
    assert {"done", "create_task", "check_notifications"} <= names  # the stop tool and the user's tools too
    assert len(engine.constraints) == 2 and all(c is not None for c in engine.constraints)  # tool_choice required
    # solo_tool_choice auto: no constraint (an engine without grammars, e.g. vllm), the same simulation
    sim, _, _ = await episode(payload_for("create_task_1"), script, domain="mock", user="solo",
                              solo_tool_choice="auto")
    assert sim.reward_info.reward == (1.0 if right else 0.0)


class ShortContextEngine(ScriptedEngine):
    """The scripted engine with a 300-token context, refusing longer prompts as every real engine does."""

    configured_max_prompt = 300

    async def generate(self, req):
        self.check_prompt(req.prompt_ids)
        return await super().generate(req)


async def test_policy_failures_end_the_simulation_with_taus_zero():
    sim, _, _ = await episode(payload_for("create_task_1"), lambda p, n: "<|im_end|>", domain="mock",
                              user="scripted")  # an empty reply
    assert sim.termination_reason == TerminationReason.AGENT_ERROR
    assert sim.reward_info.reward == own_evaluation(sim, "mock", "create_task_1").reward == 0.0
    sim, _, _ = await episode(payload_for("create_task_1"), lambda p, n: "I cannot do that.<|im_end|>",
                              domain="mock", user="solo", solo_tool_choice="auto")  # solo: no tool call
    assert sim.termination_reason == TerminationReason.AGENT_ERROR and sim.reward_info.reward == 0.0
    sim, _, _ = await episode(payload_for("create_task_1"), lambda p, n: "<|im_end|>", domain="mock", user="solo",
                              solo_tool_choice="auto")  # solo: an empty first reply (made at the start)
    assert sim.termination_reason == TerminationReason.AGENT_ERROR and sim.reward_info.reward == 0.0
    # a prompt past the context (the endpoint's context_length_exceeded): τ²-bench's system prompt alone here
    sim, session, _ = await episode(payload_for("create_task_1"), agent_script(MEETING), ShortContextEngine,
                                    domain="mock", user="scripted")
    assert not session.calls and sim.termination_reason == TerminationReason.AGENT_ERROR
    assert sim.reward_info.reward == own_evaluation(sim, "mock", "create_task_1").reward == 0.0


async def test_a_cancelled_episode_stops_its_simulation_thread():
    """rollout.agent.timeout_s cancels the episode: the policy's call in flight is cancelled and the simulation's
    thread ends there, making no further call."""
    tok = char_tokenizer(QWEN_LIKE_TEMPLATE)
    engine = ScriptedEngine(tok, agent_script(MEETING), token_delay_s=0.05)  # ~4 s for the tool call
    async with endpoint(engine, tok, agent_config(workflow="agent", sampling={"max_new_tokens": 240})) as server:
        task = PromptTask(run="agents", prompt_id="p0", epoch=0, payload=payload_for("create_task_1"))
        session = server.store.open(task, 0)
        before = set(threading.enumerate())
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(tau2_env.run(client_for(server, session), task_json(task), domain="mock",
                                                user="scripted"), 0.5)
        for _ in range(50):  # the thread ends at the cancelled call
            running = [t for t in threading.enumerate() if t.name == "tau2-simulation" and t not in before]
            if not running:
                break
            await asyncio.sleep(0.1)
        assert not running
    assert engine.calls == 1


@pytest.mark.parametrize("met", [True, False])
async def test_nl_assertion_judge_at_an_openai_compatible_url(met, tmp_path, monkeypatch):
    """Retail task 24's reward is DB x NL assertions: τ²-bench's judge (configured to another endpoint session)
    decides; the policy only answers (the DB is left as it was, as the task expects)."""
    from tau2.evaluator import evaluator_nl_assertions as nl

    for name in ("DEFAULT_LLM_NL_ASSERTIONS", "DEFAULT_LLM_NL_ASSERTIONS_ARGS"):  # restored after the test
        monkeypatch.setattr(nl, name, getattr(nl, name))
    task = task_of("retail", "24")
    (assertion,) = task.evaluation_criteria.nl_assertions

    def script(prompt: str, n: int) -> str:
        if "expectedOutcomes" in prompt:  # τ²-bench's NL-assertion judge
            return json.dumps({"results": [{"expectedOutcome": assertion, "reasoning": "scripted",
                                            "metExpectation": met}]}) + "<|im_end|>"
        return "The two t-shirts are polyester and cotton.<|im_end|>"

    judge = {}

    def judge_url(server):
        s = server.store.open(PromptTask(run="agents", prompt_id="j", epoch=0, payload={"prompt": "judge"}), 2)
        judge["session"] = s
        (tmp_path / "judge.key").write_text(s.key)
        return server.store.url(s)

    sim, _, _ = await episode(payload_for("24", "retail"), script, domain="retail", user="scripted",
                              judge_model="judge", judge_base_url=judge_url,
                              judge_api_key_file=str(tmp_path / "judge.key"))
    assert len(judge["session"].calls) == 1
    assert nl.DEFAULT_LLM_NL_ASSERTIONS == "openai/judge"  # the adapter configured τ²-bench's judge
    assert sim.reward_info.nl_assertions[0].met is met
    assert sim.reward_info.db_check.db_match is True
    assert sim.reward_info.reward == (1.0 if met else 0.0)


def rows_of(tmp_path, *args: str) -> tuple[list[dict], list[dict]]:
    """The data command's (train, held-out) rows, each as the controller makes it a task payload."""
    tau2_data.main(["--out", str(tmp_path), *args])
    out = []
    for name in ("train", "heldout"):
        rows = [obj for _, obj in json_objects(tmp_path / f"{name}.jsonl")]
        payloads = [to_payload(r, resolve_mapping(FieldMapping(), rows[0])) for r in rows] if rows else []
        assert all(err is None for _, err in payloads), payloads
        out.append([p for p, _ in payloads])
    return out[0], out[1]


async def test_data_command_writes_the_domains_tasks(tmp_path):
    train, held = rows_of(tmp_path / "mock", "--domain", "mock", "--heldout", "3")
    ids = [t.id for t in registry.get_tasks_loader("mock")()]
    assert [p["metadata"]["tau2"]["task_id"] for p in train + held] == ids
    assert len(held) == 3 and all(p["metadata"]["split"] == "heldout" for p in held)
    assert train[0]["metadata"]["tau2"] == {"domain": "mock", "task_set": "mock", "task_id": "create_task_1"}
    assert train[0]["reference"] == "create_task(user_id=user_1, title=Important Meeting)"
    assert "Create a new task called 'Important Meeting'" in train[0]["prompt"]
    # a row as the controller hands it to the adapter plays its task
    sim, _, _ = await episode(train[0], agent_script(MEETING), domain="mock", user="scripted")
    assert sim.task_id == "create_task_1" and sim.reward_info.reward == 1.0
    # a domain with train / test splits: those, by default
    train, held = rows_of(tmp_path / "retail", "--domain", "retail", "--limit", "5", "--heldout", "2")
    splits = registry.get_task_splits_loader("retail")()
    assert [p["metadata"]["tau2"]["task_id"] for p in train] == splits["train"][:5]
    assert [p["metadata"]["tau2"]["task_id"] for p in held] == splits["test"][:2]


async def test_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(Tau2EnvError, match=r"τ²-bench has no domain 'nope' \(its domains: mock, airline"):
        await tau2_env.run(None, payload_for("x"), domain="nope", user="scripted")
    with pytest.raises(SystemExit, match="τ²-bench has no domain 'nope'"):
        tau2_data.main(["--domain", "nope", "--out", str(tmp_path)])
    with pytest.raises(Tau2EnvError, match="'banking_knowledge' is not supported"):
        await tau2_env.run(None, payload_for("x"), domain="banking_knowledge", user="scripted")
    with pytest.raises(Tau2EnvError, match=r"task set 'mock' has no task 'no_such_task' \(10 tasks: create_"):
        await episode(payload_for("no_such_task"), agent_script(MEETING), domain="mock", user="scripted")
    with pytest.raises(Tau2EnvError, match="task p0 has no metadata.tau2.task_id .*tau2_data --domain mock"):
        await episode({"prompt": "hi"}, agent_script(MEETING), domain="mock", user="scripted")
    with pytest.raises(Tau2EnvError, match="task p0 is a task of τ²-bench domain 'retail', but the adapter's "
                                           "domain is 'mock'"):
        await episode(payload_for("24", "retail"), agent_script(MEETING), domain="mock", user="scripted")
    with pytest.raises(Tau2EnvError, match="user: llm needs user_model"):
        await tau2_env.run(None, payload_for("create_task_1"), domain="mock")
    with pytest.raises(Tau2EnvError, match="user='human': one of llm, scripted, solo"):
        await tau2_env.run(None, payload_for("create_task_1"), domain="mock", user="human")
    with pytest.raises(Tau2EnvError, match="'update_task_with_message_history' cannot be played solo"):
        await episode(payload_for("update_task_with_message_history"), agent_script(MEETING), domain="mock",
                      user="solo")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(Tau2EnvError, match="task '24': its reward includes NL assertions.*set judge_model"):
        await episode(payload_for("24", "retail"), agent_script(MEETING), domain="retail", user="scripted")
    # the endpoint refuses a call: the episode fails, saying why
    with pytest.raises(Tau2EnvError, match="the policy's call failed: BadRequestError: .*max_tokens"):
        await episode(payload_for("create_task_1"), agent_script(MEETING), domain="mock", user="scripted",
                      sampling_args={"max_tokens": 100_000})
    with pytest.raises(Tau2EnvError, match="user_api_key_file: cannot read /nonexistent/key"):
        await episode(payload_for("create_task_1"), agent_script(MEETING), domain="mock", user="llm",
                      user_model="m", user_base_url="http://127.0.0.1:9/v1", user_api_key_file="/nonexistent/key")
