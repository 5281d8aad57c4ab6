"""An agent through the OpenAI-compatible endpoint against the same engine called directly in the worker.

The same two-turn episode both ways (answer, "again", answer: two calls, the second's prompt extending the
first's tokens, merged into one sample), on the local engine with a ~21M-parameter untied Qwen2 (hidden 512,
8 layers, random init, fp32 on CPU), fixed output lengths (ignore_eos), `--concurrency` episodes at once:

  direct    ctx.generate twice, the second prompt built from the first call's tokens, episode_samples();
  in-process  an `async def run(client, task)` agent run by the worker's EntryRunner, its openai.AsyncOpenAI
              calling the worker's endpoint app (AgentServer) in-process, as entry agents do by default
              (rollout.agent.entry_transport: in_process); then episode_samples();
  http        the same over loopback HTTP to the endpoint's uvicorn server in the same process
              (entry_transport: http; command and service agents come this way, from their own processes);
  stream      the in-process agent with `stream=True` (server-sent chunks, joined by the agent);
  responses   the in-process agent on the Responses API, the second turn by previous_response_id.

The five sides run interleaved, `--episodes` each per round, the order turned each round, so a slow
patch of the machine hits them alike; each side's figure is its episodes over its summed seconds.

    python -m bench.agent_endpoint [--episodes 32] [--rounds 6] [--concurrency 16] [--tokens 32] [--threads 1]

Last lines: `agent_endpoint_http_ratio: X`, `agent_endpoint_ratio: X` (in-process episodes/s / direct),
`agent_endpoint_responses_ratio: X` and, last, `agent_endpoint_stream_ratio: X`.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from rollout_service.agents.runners import EntryRunner
from rollout_service.agents.server import AgentServer
from rollout_service.agents.trajectory import episode_samples
from rollout_service.engines.local import LocalEngine
from rollout_service.tools import ToolRegistry
from rollout_service.workflows.base import WorkflowContext
from shared.config import JetrlConfig
from shared.contract.messages import PromptTask

MODEL = {"tiny_hidden": 512, "tiny_layers": 8, "tiny_heads": 8, "seed": 0}


def prompt(i: int) -> str:
    return "max " + " ".join(str((i * 7 + k * 3) % 10) for k in range(5)) + " ="


async def direct_episode(ctx: WorkflowContext, i: int, tokens: int) -> int:
    from dataclasses import replace

    from rollout_service.agents.session import Call
    from rollout_service.engines.base import SamplingParams

    sp = replace(SamplingParams.from_config(ctx.cfg.rollout.sampling), max_new_tokens=tokens, seed=i)
    first_ids = ctx.encode(prompt(i))
    r1 = await ctx.generate(first_ids, sp)
    c1 = Call(first_ids, r1, ctx.decode(r1.output_ids))
    second_ids = c1.tokens + ctx.encode("\nagain")
    r2 = await ctx.generate(second_ids, sp)
    (s,) = episode_samples([c1, Call(second_ids, r2, ctx.decode(r2.output_ids))], 1.0)
    return s.num_generated


async def two_turn_agent(client, task) -> float:
    """The agent of the endpoint side, run by the worker's EntryRunner (a client per episode, shared pool)."""
    msgs = [{"role": "user", "content": task["prompt"]}]
    r = await client.chat.completions.create(model="policy", messages=msgs, seed=task["seed"])
    msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": "again"}]
    await client.chat.completions.create(model="policy", messages=msgs, seed=task["seed"])
    return 1.0


async def two_turn_stream_agent(client, task) -> float:
    """The same agent with stream=True: it joins the content deltas, as a streaming framework does."""
    msgs = [{"role": "user", "content": task["prompt"]}]
    for turn in range(2):
        chunks = await client.chat.completions.create(model="policy", messages=msgs, seed=task["seed"], stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
        if turn == 0:
            msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "again"}]
    return 1.0


async def two_turn_responses_agent(client, task) -> float:
    """The same agent on the Responses API, its second turn continuing the first by previous_response_id."""
    seed = {"seed": task["seed"]}
    r = await client.responses.create(model="policy", input=task["prompt"], extra_body=seed)
    await client.responses.create(model="policy", input="again", previous_response_id=r.id, extra_body=seed)
    return 1.0


async def endpoint_episode(server: AgentServer, runner: EntryRunner, i: int) -> int:
    task = PromptTask(run="bench", prompt_id=f"p{i}", epoch=0, payload={"prompt": prompt(i), "seed": i})
    session = server.store.open(task, 0)
    try:
        reward = await runner(session, server.store)
    finally:
        server.store.close(session)
    samples = episode_samples(session.calls, reward)
    assert len(samples) == 1, "the two calls did not merge"
    return samples[0].num_generated


async def timed(episodes: int, concurrency: int, one) -> tuple[float, int]:
    sem = asyncio.Semaphore(concurrency)

    async def guarded(i: int) -> int:
        async with sem:
            return await one(i)

    t = time.perf_counter()
    tokens = sum(await asyncio.gather(*(guarded(i) for i in range(episodes))))
    return time.perf_counter() - t, tokens


async def main(args) -> None:
    local = {"max_batch": 32, "max_prefill_batch": 32, "torch_threads": args.threads}
    cfg = JetrlConfig.model_validate({"run": "bench", "model": MODEL, "telemetry": {"metrics_port": -1},
                                      "rollout": {"sampling": {"ignore_eos": True, "max_new_tokens": args.tokens},
                                                  "agent": {"max_calls": 8}, "local": local}})
    engine = LocalEngine(cfg)
    await engine.start()
    ctx = WorkflowContext(engine=engine, tokenizer=engine.tokenizer, reward=None, tools=ToolRegistry(), cfg=cfg)
    server = AgentServer(ctx)
    await server.start()
    app = server.store.app  # rollout.agent.entry_transport: in_process (the default)
    runners = {"in-process": EntryRunner("bench.agent_endpoint:two_turn_agent"),
               "http": EntryRunner("bench.agent_endpoint:two_turn_agent"),
               "stream": EntryRunner("bench.agent_endpoint:two_turn_stream_agent"),
               "responses": EntryRunner("bench.agent_endpoint:two_turn_responses_agent")}

    def side(name: str):
        """The episode function of one side, called right before that side runs."""
        if name == "direct":
            return lambda i: direct_episode(ctx, i, args.tokens)
        server.store.app = None if name == "http" else app  # what each runner's first call sees
        return lambda i: endpoint_episode(server, runners[name], i)

    names = ["direct", "in-process", "http", "stream", "responses"]
    secs, toks = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0)
    try:
        for name in names:  # warm-up
            await timed(args.concurrency, args.concurrency, side(name))
        for r in range(args.rounds):  # interleaved, the order turned each round: drift hits every side alike
            for name in names[r % len(names):] + names[: r % len(names)]:
                s, tok = await timed(args.episodes, args.concurrency, side(name))
                print(f"round {r + 1} {name:10s} {args.episodes / s:.2f} episodes/s")
                secs[name] += s
                toks[name] += tok
        in_process = {name: type(r._http._transport).__name__ == "ASGITransport" for name, r in runners.items()}
        assert in_process == {"in-process": True, "http": False, "stream": True, "responses": True}, in_process  # each side went the way it says
    finally:
        for runner in runners.values():
            await runner.close()
        await server.close()
        await engine.close()
    total = args.rounds * args.episodes
    assert all(t == total * 2 * args.tokens for t in toks.values()), toks
    print(f"episodes {total} a side in {args.rounds} rounds (2 calls x {args.tokens} tokens), "
          f"concurrency {args.concurrency}")
    for name in names:
        print(f"{name:10s}  {total / secs[name]:.2f} episodes/s, {toks[name] / secs[name]:.1f} tokens/s "
              f"({secs[name]:.2f} s)")
    print(f"agent_endpoint_http_ratio: {secs['direct'] / secs['http']:.3f}")
    print(f"agent_endpoint_ratio: {secs['direct'] / secs['in-process']:.3f}")
    print(f"agent_endpoint_responses_ratio: {secs['direct'] / secs['responses']:.3f}")
    print(f"agent_endpoint_stream_ratio: {secs['direct'] / secs['stream']:.3f}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=32, help="episodes a side per round")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--tokens", type=int, default=32, help="tokens per call (fixed: ignore_eos)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the engine (1 is fastest on a shared "
                   "2-core box)")
    asyncio.run(main(p.parse_args()))
