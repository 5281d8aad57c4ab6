"""`workflow: agent` in a real rollout worker on a real nats-server: agents in the worker and as external
commands; an agent that crashes, hangs or never ends gets its group dead-lettered with the reason while
the worker keeps serving, and every prompt ends up either as a group or as a dead letter."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from rollout_doubles import MaxDigitReward, ScriptedEngine, read_groups, wait_for, worker_config

from rollout_service.service import RolloutWorker
from rollout_service.workflows.agent import AgentWorkflow
from rollout_service.workflows.loader import WorkflowLoadError, load_workflow
from shared.contract import bus, codec, subjects
from shared.contract.messages import DeadLetter, PromptTask
from shared.model.tinymodel import build_tokenizer

RUN = "ag"
HERE = Path(__file__).resolve().parent


def answer_max(prompt: str, n: int) -> str:
    digits = [c for c in prompt.split("=")[0] if c.isdigit()]
    return " " + max(digits or ["0"])


def make_worker(nats_config, workflow: AgentWorkflow, timeout_s: float = 30.0, **agent) -> RolloutWorker:
    tok = build_tokenizer()
    cfg = worker_config(nats_config.servers[0], RUN, agent={"timeout_s": timeout_s, "max_calls": 6, **agent})
    cfg.rollout.service.follow_weights = False
    return RolloutWorker(cfg, engine=ScriptedEngine(tok, answer_max), tokenizer=tok, reward=MaxDigitReward(),
                         workflow=workflow, instance="agent-worker")


async def publish(js, nc, ids: list[str]) -> None:
    for i, pid in enumerate(ids):
        t = PromptTask(run=RUN, prompt_id=pid, epoch=0, payload={"prompt": f"max 1 {i % 10} 3 =", "reference": str(
            max(3, i % 10))}, group_size=2)
        await bus.publish(js, nc, subjects.prompts(RUN), t, msg_id=t.group_id)


async def dead_letters(js, n: int, timeout: float = 60) -> dict[str, str]:
    sub = await js.pull_subscribe(subjects.dlq_all(RUN), stream=subjects.DLQ_STREAM)
    letters: list[DeadLetter] = []

    async def more():
        try:
            letters.extend(codec.decode(m.data, expect=DeadLetter) for m in await sub.fetch(n, timeout=0.5))
        except Exception:
            pass
        return len(letters) >= n

    await wait_for(more, timeout=timeout, what=f"{n} dead letters")
    return {codec.decode(d.original, expect=PromptTask).prompt_id: d.reason for d in letters}


async def groups_for(js, n: int):
    async def got():
        g = await read_groups(js, RUN)
        return g if len(g) >= n else None
    return await wait_for(got, what=f"{n} trajectory groups")


def test_agent_workflow_args_are_checked_at_start():
    with pytest.raises(WorkflowLoadError, match="exactly one of workflow_args.entry"):
        load_workflow("agent", {})
    with pytest.raises(WorkflowLoadError, match="no attribute 'nope'"):
        load_workflow("agent", {"entry": f"{HERE / 'agent_examples.py'}:nope"})
    assert isinstance(load_workflow("agent", {"command": "node agent.mjs"}), AgentWorkflow)
    entry = f"{HERE / 'agent_examples.py'}:configured"
    with pytest.raises(WorkflowLoadError, match="do not fit .*configured"):
        load_workflow("agent", {"entry": entry, "args": {"rewrd": 1.0}})
    with pytest.raises(WorkflowLoadError, match="a command or service agent takes none"):
        load_workflow("agent", {"command": "node agent.mjs", "args": {"reward": 1.0}})


async def test_an_entry_agent_gets_workflow_args_args_as_keyword_arguments(nats_config, nc, js):
    wf = load_workflow("agent", {"entry": f"{HERE / 'agent_examples.py'}:configured",
                                 "args": {"reward": 0.75, "max_tokens": 2}})
    worker = make_worker(nats_config, wf)
    task = asyncio.create_task(worker.run())
    try:
        await publish(js, nc, ["cfg-0"])
        (g,) = await groups_for(js, 1)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
    assert [s.reward for s in g.samples] == [0.75, 0.75] and all(s.num_generated <= 2 for s in g.samples)


@pytest.mark.parametrize("transport", ["in_process", "http"])
async def test_failing_agents_are_dead_lettered_with_the_reason_and_the_worker_keeps_serving(nats_config, nc, js,
                                                                                              transport):
    wf = AgentWorkflow(entry=f"{HERE / 'agent_examples.py'}:by_prompt")
    worker = make_worker(nats_config, wf, timeout_s=4.0, entry_transport=transport)
    run = asyncio.create_task(worker.run())
    await publish(js, nc, ["crash-0", "hang-1", "endless-2", "ok-3", "self-4"])
    reasons = await dead_letters(js, 3)
    groups = {g.prompt_id: g for g in await groups_for(js, 2)}
    await publish(js, nc, ["ok-5"])  # after all that, the worker still serves
    groups |= {g.prompt_id: g for g in await groups_for(js, 3)}
    await wait_for(lambda: _empty(js), what="every prompt acked or terminated")
    # the entry agents' client went in-process (no socket) or over HTTP, as configured
    assert (type(wf.runner._http._transport).__name__ == "ASGITransport") == (transport == "in_process")
    worker.stop()
    await asyncio.wait_for(run, 30)
    assert set(reasons) == {"crash-0", "hang-1", "endless-2"} and set(groups) == {"ok-3", "self-4", "ok-5"}
    assert all(r.startswith("rejected: agent (entry ") for r in reasons.values())  # at once, not retried
    assert "raised RuntimeError: the agent fell over" in reasons["crash-0"]
    assert "still running after rollout.agent.timeout_s = 4 s" in reasons["hang-1"]
    assert "never ended its episode: kept calling past rollout.agent.max_calls = 6" in reasons["endless-2"]
    assert not worker.agents.store.sessions  # every session closed
    assert (worker.agents.store.app is not None) == (transport == "in_process")
    ok = groups["ok-3"]
    assert ok.workflow == "agent" and len(ok.samples) == 2
    for s in ok.samples:  # two calls merged into one sample, scored by the reward service on the last answer
        assert s.metrics["calls"] == 2 and s.metrics["reward_source"] == "reward_service" and s.reward == 1.0
        assert s.loss_mask.sum() == 4 and s.validate() is None
    assert [s.reward for s in groups["self-4"].samples] == [0.25, 0.25]
    assert all(s.metrics["reward_source"] == "agent" for s in groups["self-4"].samples)


async def _empty(js) -> bool:
    return (await js.stream_info(subjects.PROMPTS_STREAM)).state.messages == 0


async def test_an_external_command_agent_posts_its_reward_and_a_crashing_one_is_dead_lettered(nats_config, nc, js):
    good = make_worker(nats_config, AgentWorkflow(command=[sys.executable, str(HERE / "agent_command.py")]))
    run = asyncio.create_task(good.run())
    await publish(js, nc, ["ok-0", "ok-1"])
    groups = await groups_for(js, 2)
    good.stop()
    await asyncio.wait_for(run, 30)
    for g in groups:
        assert len(g.samples) == 2
        assert all(s.reward == 1.0 and s.metrics["reward_source"] == "agent" for s in g.samples)
    bad = make_worker(nats_config, AgentWorkflow(command=[sys.executable, str(HERE / "agent_command.py"), "3"]))
    run = asyncio.create_task(bad.run())
    await publish(js, nc, ["bad-2"])
    reasons = await dead_letters(js, 1)
    bad.stop()
    await asyncio.wait_for(run, 30)
    assert "agent command exited with code 3: agent: cannot go on" in reasons["bad-2"]


async def test_retry_failed_naks_instead_of_dead_lettering_at_once(nats_config, nc, js):
    worker = make_worker(nats_config, AgentWorkflow(entry=f"{HERE / 'agent_examples.py'}:by_prompt"),
                         retry_failed=True)
    worker.cfg.rollout.service.max_deliver = 2
    run = asyncio.create_task(worker.run())
    await publish(js, nc, ["crash-0"])
    reasons = await dead_letters(js, 1)
    worker.stop()
    await asyncio.wait_for(run, 30)
    assert reasons["crash-0"].startswith("handler failed on delivery 2/2") and "the agent fell over" in reasons["crash-0"]


async def test_a_long_running_agent_service_takes_episodes_from_nats(nats_config, nc, js):
    from agent_examples import two_turns

    from rollout_service.agents.agent_service import serve_agent

    worker = make_worker(nats_config, AgentWorkflow(service="solver"))
    run = asyncio.create_task(worker.run())
    await publish(js, nc, ["early-0"])  # no agent service yet: dead-lettered, saying so
    reasons = await dead_letters(js, 1)
    assert "no agent service answers on jetrl.ag.agents.solver" in reasons["early-0"]
    sub = await serve_agent(nc, RUN, "solver", two_turns)
    await publish(js, nc, ["ok-1", "ok-2"])
    groups = await groups_for(js, 2)
    await sub.unsubscribe()
    worker.stop()
    await asyncio.wait_for(run, 30)
    assert {g.prompt_id for g in groups} == {"ok-1", "ok-2"}
    for s in (s for g in groups for s in g.samples):
        assert s.metrics["calls"] == 2 and s.metrics["reward_source"] == "reward_service" and s.validate() is None
    with pytest.raises(WorkflowLoadError, match="agent service name"):
        AgentWorkflow(service="bad name")
