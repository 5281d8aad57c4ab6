"""Workflows against the Engine interface with scripted (forced) model output: token bookkeeping, masks,
versions, multi-turn feedback, tool calling, user workflows by import path."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from rollout_doubles import QWEN_LIKE_TEMPLATE, MaxDigitReward, ScriptedEngine, char_tokenizer, is_close

from rollout_service.tools import ToolRegistry, build_tools
from rollout_service.workflows import WorkflowContext, WorkflowLoadError, load_workflow
from rollout_service.workflows.multi_turn import MultiTurnWorkflow
from rollout_service.workflows.single_turn import SingleTurnWorkflow
from rollout_service.workflows.tool_agent import ToolAgentWorkflow
from shared.config import JetrlConfig
from shared.contract.consumer import Transient
from shared.contract.messages import PromptTask
from shared.model.tinymodel import build_tokenizer

REPO = Path(__file__).resolve().parents[2]


def make_ctx(engine, tokenizer, reward=None, tools=None, **overrides) -> WorkflowContext:
    overrides.setdefault("rollout", {}).setdefault("sampling", {}).setdefault("max_new_tokens", 256)
    cfg = JetrlConfig.model_validate({"reward": {"task": "maxdigit"}, **overrides})
    return WorkflowContext(engine=engine, tokenizer=tokenizer, reward=reward or MaxDigitReward(),
                           tools=tools if tools is not None else ToolRegistry(), cfg=cfg)


def task(prompt="max 3 8 1 5 2 =", reference="8", n=1, **kw) -> PromptTask:
    return PromptTask(run="r1", prompt_id="p1", epoch=0, payload={"prompt": prompt, "reference": reference},
                      group_size=n, **kw)


def masked_text(tok, s, value: int) -> str:
    ids = s.tokens[s.prompt_len:][s.loss_mask[s.prompt_len:] == value]
    return tok.decode(ids.tolist(), skip_special_tokens=False)


async def test_single_turn_sample_is_prompt_plus_policy_tokens_with_logprobs_and_versions():
    tok = build_tokenizer()  # the tiny task tokenizer: no chat template, plain text
    answers = [" 8", " 3"]
    eng = ScriptedEngine(tok, lambda p, n: answers[n % 2], logprob=-0.5)
    reward = MaxDigitReward()
    samples = await SingleTurnWorkflow().run(make_ctx(eng, tok, reward), task(n=2))
    prompt_ids = tok.encode("max 3 8 1 5 2 =", add_special_tokens=False)
    assert len(samples) == 2
    for s, ans in zip(samples, answers, strict=True):
        gen = tok.encode(ans, add_special_tokens=False)
        assert s.tokens.tolist() == prompt_ids + gen
        assert s.prompt_len == len(prompt_ids)
        assert s.loss_mask.tolist() == [0] * len(prompt_ids) + [1] * len(gen)
        assert np.allclose(s.logprobs, [0.0] * len(prompt_ids) + [-0.5] * len(gen))
        assert s.versions.tolist() == [-1] * len(prompt_ids) + [0] * len(gen)
        assert s.turns.tolist() == [len(prompt_ids)]
        assert s.validate() is None
    assert [s.reward for s in samples] == [1.0, 0.0]
    assert reward.calls == [[" 8", " 3"]]  # one reward request per group


async def test_version_swapped_mid_generation_shows_up_in_per_token_versions():
    tok = build_tokenizer()
    eng = ScriptedEngine(tok, lambda p, n: " 8 is the largest digit", token_delay_s=0.02)
    ctx = make_ctx(eng, tok)
    run = asyncio.create_task(SingleTurnWorkflow().run(ctx, task()))
    while eng.calls == 0 or not eng.prompts:
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.1)
    await eng.update_weights(1, path="/weights/v1")
    s = (await run)[0]
    gen_versions = s.versions[s.loss_mask == 1].tolist()
    assert gen_versions[0] == 0 and gen_versions[-1] == 1
    switch = gen_versions.index(1)
    assert gen_versions == [0] * switch + [1] * (len(gen_versions) - switch)
    assert s.oldest_version() == 0


async def test_seeded_sampling_gives_each_group_member_its_own_seed():
    tok = build_tokenizer()
    eng = ScriptedEngine(tok, lambda p, n: " 8")
    ctx = make_ctx(eng, tok, rollout={"sampling": {"seed": 10}})
    assert [ctx.sampling(task(), i).seed for i in range(3)] == [10, 11, 12]
    with pytest.raises(ValueError, match="sampling.temp"):
        ctx.sampling(task(sampling={"temp": 1.0}))


async def test_multi_turn_feedback_is_masked_and_reward_discounted_per_turn():
    tok = build_tokenizer()
    eng = ScriptedEngine(tok, lambda p, n: " 8" if "wrong" in p else " 3")
    ctx = make_ctx(eng, tok, rollout={"multi_turn": {"max_turns": 3, "turn_discount": 0.5}})
    s = (await MultiTurnWorkflow().run(ctx, task()))[0]
    assert is_close(s.reward, 0.5)  # right at turn 1 (0-based): 1.0 * 0.5 ** 1
    assert s.metrics["turns"] == 2
    assert masked_text(tok, s, 1) == " 3 8"
    assert masked_text(tok, s, 0) == "\nwrong, try again\n"
    p = s.prompt_len
    assert s.turns.tolist() == [p, p + 2, p + 2 + len("\nwrong, try again\n")]
    assert (s.versions[s.loss_mask == 0] == -1).all() and (s.logprobs[s.loss_mask == 0] == 0).all()


async def test_multi_turn_stops_after_k_turns_with_the_last_reward():
    tok = build_tokenizer()
    eng = ScriptedEngine(tok, lambda p, n: " 1")
    ctx = make_ctx(eng, tok, rollout={"multi_turn": {"max_turns": 3}})
    s = (await MultiTurnWorkflow().run(ctx, task()))[0]
    assert s.reward == 0.0 and s.metrics["turns"] == 3 and eng.calls == 3


async def test_multi_turn_with_chat_template_renders_feedback_as_a_user_turn():
    tok = char_tokenizer(QWEN_LIKE_TEMPLATE)
    eng = ScriptedEngine(tok, lambda p, n: "8" if "wrong" in p else "3<|im_end|>")
    ctx = make_ctx(eng, tok)
    s = (await MultiTurnWorkflow().run(ctx, task()))[0]
    full = tok.decode(s.tokens.tolist(), skip_special_tokens=False)
    assert full == ("<|im_start|>user\nmax 3 8 1 5 2 =<|im_end|>\n<|im_start|>assistant\n3<|im_end|>\n"
                    "<|im_start|>user\nwrong, try again<|im_end|>\n<|im_start|>assistant\n8")
    assert masked_text(tok, s, 1) == "3<|im_end|>8"
    assert is_close(s.reward, 0.9)


CALC_CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'


async def test_tool_agent_runs_the_called_tool_and_masks_its_response():
    tok = char_tokenizer()  # no chat template: plain-text tool preamble
    eng = ScriptedEngine(tok, lambda p, n: "42" if "</tool_response>" in p else CALC_CALL + " ignored")
    ctx = make_ctx(eng, tok, tools=build_tools(ctx_tools()))
    s = (await ToolAgentWorkflow().run(ctx, task("what is 6*7?", "42")))[0]
    prompt = tok.decode(s.tokens[: s.prompt_len].tolist())
    assert "calculator(expression)" in prompt and "<tool_call>" in prompt
    assert masked_text(tok, s, 1) == CALC_CALL + "42"  # generation stopped at </tool_call>
    assert masked_text(tok, s, 0) == "\n<tool_response>\n42\n</tool_response>\n"
    assert s.reward == 1.0 and s.metrics["tool_calls"] == 1 and s.metrics["tool_errors"] == 0
    assert ctx.stats.tool_calls == 1 and len(s.turns) == 3


def ctx_tools(**kw):
    from shared.config.workflows import ToolsConfig

    return ToolsConfig(**kw)


async def test_tool_agent_answers_a_malformed_call_with_an_error_turn():
    tok = char_tokenizer()
    bad = '<tool_call>{"name": "calculator", "arguments": {expression: 6*7}}</tool_call>'
    eng = ScriptedEngine(tok, lambda p, n: "42" if "</tool_response>" in p else bad)
    ctx = make_ctx(eng, tok, tools=build_tools(ctx_tools()))
    s = (await ToolAgentWorkflow().run(ctx, task("what is 6*7?", "42")))[0]
    env = masked_text(tok, s, 0)
    assert "<tool_response>\nerror: tool call 1 is not valid JSON" in env
    assert s.reward == 1.0 and s.metrics["tool_errors"] == 1 and s.finish_reason == "stop"


async def test_tool_agent_cuts_off_a_hanging_tool_at_its_time_limit():
    tok = char_tokenizer()
    hang = '<tool_call>{"name": "python", "arguments": {"code": "while True: pass"}}</tool_call>'
    eng = ScriptedEngine(tok, lambda p, n: "done" if "</tool_response>" in p else hang)
    ctx = make_ctx(eng, tok, tools=build_tools(ctx_tools(timeout_s=1.0)))
    s = (await asyncio.wait_for(ToolAgentWorkflow().run(ctx, task("loop", "done")), 60))[0]
    env = masked_text(tok, s, 0)
    assert "error: python" in env and ("time limit" in env or "timed out" in env)
    assert s.reward == 1.0 and s.metrics["tool_errors"] == 1


async def test_tool_agent_ends_with_tool_limit_when_the_model_never_answers():
    tok = char_tokenizer()
    eng = ScriptedEngine(tok, lambda p, n: CALC_CALL)
    ctx = make_ctx(eng, tok, tools=build_tools(ctx_tools()), rollout={"tool_agent": {"max_turns": 3}})
    s = (await ToolAgentWorkflow().run(ctx, task("what is 6*7?", "42")))[0]
    assert s.finish_reason == "tool_limit" and eng.calls == 3 and s.metrics["tool_calls"] == 2


async def test_tool_agent_with_chat_template_passes_tools_and_uses_the_tool_role():
    tok = char_tokenizer(QWEN_LIKE_TEMPLATE)
    eng = ScriptedEngine(tok, lambda p, n: "42<|im_end|>" if "</tool_response>" in p else CALC_CALL)
    ctx = make_ctx(eng, tok, tools=build_tools(ctx_tools()))
    s = (await ToolAgentWorkflow().run(ctx, task("what is 6*7?", "42")))[0]
    full = tok.decode(s.tokens.tolist(), skip_special_tokens=False)
    assert full.startswith("<|im_start|>system\n# Tools\ncalculator\npython\n<|im_end|>\n<|im_start|>user\n")
    assert masked_text(tok, s, 0) == ("<|im_end|>\n<|im_start|>user\n<tool_response>\n42\n</tool_response>"
                                      "<|im_end|>\n<|im_start|>assistant\n")
    assert s.reward == 1.0


async def test_reward_service_failure_is_transient_not_a_zero_reward():
    tok = build_tokenizer()
    ctx = make_ctx(ScriptedEngine(tok, lambda p, n: " 8"), tok, reward=MaxDigitReward(fail=True))
    with pytest.raises(Transient, match="no responders"):
        await SingleTurnWorkflow().run(ctx, task())


async def test_user_workflow_from_an_import_path_runs(monkeypatch):
    monkeypatch.chdir(REPO)
    wf = load_workflow("examples.workflows.countdown:CountdownWorkflow", {"hint": "="})
    tok = build_tokenizer()
    eng = ScriptedEngine(tok, lambda p, n: ["3*5+7", "3+5"][n % 2])
    t = PromptTask(run="r1", prompt_id="c1", epoch=0, payload={"numbers": [3, 5, 7], "target": 22}, group_size=2)
    samples = await wf.run(make_ctx(eng, tok), t)
    assert [s.reward for s in samples] == [1.0, 0.1]
    assert eng.prompts[0] == "use 3 5 7 to make 22 ="
    by_file = load_workflow(str(REPO / "examples/workflows/countdown.py") + ":CountdownWorkflow")
    assert by_file.name == "countdown"


@pytest.mark.parametrize("spec, message", [
    ("no_such_pkg.mod:Wf", "no module named 'no_such_pkg'"),
    ("examples.workflows.countdown:Nope", "has no attribute 'Nope'.*CountdownWorkflow"),
    ("examples.workflows.countdown:countdown_reward", "is a function, not a class"),
    ("shared.contract.messages:Sample", "needs `async def run"),
    ("rollout_service.workflows.base:Workflow", "is abstract"),
    ("singleturn", "not a built-in workflow"),
    ("./missing.py:Wf", "does not exist"),
])
def test_bad_workflow_path_fails_with_a_clear_error(spec, message, monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(WorkflowLoadError, match=message):
        load_workflow(spec)


def test_workflow_args_that_do_not_fit_are_a_clear_error():
    with pytest.raises(WorkflowLoadError, match="workflow_args do not fit SingleTurnWorkflow"):
        load_workflow("single_turn", {"turns": 3})
