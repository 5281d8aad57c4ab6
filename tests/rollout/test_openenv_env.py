"""The OpenEnv adapter (rollout_service/environments/openenv_env.py) against a real OpenEnv environment server
(examples/openenv_env: openenv-core's Environment + create_app under uvicorn, in a subprocess on loopback):
episodes through the real endpoint with a scripted policy score what the environment itself gives for the
same replies (driven directly with OpenEnv's own client), concurrent episodes keep their own games, a
one-session server serves episodes one after another, clear errors (server down or lost, reset refused, reply
that is no action), and a short `jetrl up` run trains on the environment's rewards."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from agent_helpers import agent_config, client_for, endpoint
from ci_gate import need_module
from rollout_doubles import QWEN_LIKE_TEMPLATE, ScriptedEngine, char_tokenizer
from up_helpers import run_until_trained

from shared.contract.messages import PromptTask
from shared.runtime.natsd import free_port

need_module("openenv.core", "pip install 'openenv-core==0.3.0'")

from openenv.core import GenericEnvClient  # noqa: E402

from examples.openenv_env.environment import OUT_OF_RANGE, RIGHT, GuessEnvironment, secret_for  # noqa: E402
from examples.openenv_env.models import GuessAction  # noqa: E402
from rollout_service.environments import openenv_env  # noqa: E402
from rollout_service.environments.openenv_env import OpenEnvError, render, to_action  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ENTRY = "rollout_service.environments.openenv_env:run"
TURN = re.compile(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>\n<\|im_start\|>user\n(.*?)<\|im_end\|>", re.S)


def _start_server(max_sessions: int, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    with open(log, "wb") as out:  # a file, not a pipe: a full pipe would stop the server
        proc = subprocess.Popen([sys.executable, "-m", "examples.openenv_env.server", "--port", str(port),
                                 "--max-sessions", str(max_sessions)], cwd=ROOT, stdout=out, stderr=out)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the OpenEnv server exited with {proc.returncode}: {log.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        time.sleep(0.2)
    _stop(proc)
    raise AssertionError(f"the OpenEnv server did not answer /health within 60 s: {log.read_text()}")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("openenv") / "server.log"
    proc, url = _start_server(64, log)
    yield url
    _stop(proc)
    assert "Traceback" not in log.read_text(), log.read_text()


# ---- scripted policies: they read the rendered chat (QWEN_LIKE_TEMPLATE) and reply with a guess ------------

def bisect(prompt: str, n: int) -> str:
    """Halves low..high with the game's "Too low." / "Too high." answers so far: wins within log2 guesses."""
    lo, hi = map(int, re.search(r"from (\d+) to (\d+)", prompt).groups())
    for guess, said in TURN.findall(prompt):
        if said.startswith("Too low."):
            lo = int(guess) + 1
        elif said.startswith("Too high."):
            hi = int(guess) - 1
    return f"{(lo + hi) // 2}<|im_end|>"


def loser(prompt: str, n: int) -> str:
    """Out of range, then a reply that is no number (an invalid action), then the wrong end of the range."""
    turn = len(TURN.findall(prompt))
    hi = int(re.search(r"from \d+ to (\d+)", prompt).group(1))
    secret = int(re.search(r"game (\d+)", prompt).group(1))  # the test puts the secret in the prompt
    wrong = 1 if secret != 1 else hi
    return ["0", "maybe five", str(wrong), str(wrong)][min(turn, 3)] + "<|im_end|>"


def game(seed: int, high: int = 20, max_guesses: int = 5) -> dict:
    reset = {"seed": seed, "low": 1, "high": high, "max_guesses": max_guesses}
    return {"prompt": f"Guessing game {secret_for(seed, 1, high)}. Reply with one whole number.",
            "reference": "", "metadata": {"reset": reset}}


async def episode(url: str, row: dict, script, engine=None, tok=None, **args):
    """One adapter episode through the real endpoint: (reward, the replies the policy made)."""
    tok = tok or char_tokenizer(QWEN_LIKE_TEMPLATE)
    engine = engine or ScriptedEngine(tok, script)
    async with endpoint(engine, tok, agent_config(sampling={"max_new_tokens": 16})) as srv:
        session = srv.store.open(PromptTask(run="agents", prompt_id="g", epoch=0, payload=row), 0)
        reward = await openenv_env.run(client_for(srv, session), {"prompt_id": "g", **row}, url=url, **args)
        return reward, [c.text for c in session.calls], session


async def direct(url: str, reset: dict, replies: list[str]) -> tuple[list[float], dict]:
    """The same replies played on the environment directly with OpenEnv's own client (no jetrl): each reply
    as the action {"guess": reply}; one the server's GuessAction refuses changes nothing. (rewards, state)."""
    rewards = []
    async with GenericEnvClient(base_url=url) as env:
        result = await env.reset(**reset)
        for text in replies:
            try:
                result = await env.step({"guess": text.strip()})
            except RuntimeError as exc:  # the stock client: "Server error: Invalid message (code: VALIDATION_ERROR)"
                assert "VALIDATION_ERROR" in str(exc)
                continue
            rewards.append(result.reward)
            if result.done:
                break
        return rewards, await env.state()


# ---- (a) one episode, winning and losing, multi-turn: the adapter's reward is the environment's ------------

@pytest.mark.parametrize("reward", ["last", "sum"])
async def test_winning_episode_scores_what_the_environment_gives(server, reward):
    row = game(seed=7)
    got, replies, session = await episode(server, row, bisect, action_field="guess",
                                          observation_template="{message}", reward=reward)
    rewards, state = await direct(server, row["metadata"]["reset"], replies)
    assert state["won"] and rewards[-1] == RIGHT and len(replies) >= 2  # multi-turn
    assert got == (rewards[-1] if reward == "last" else sum(rewards)) == 1.0
    assert state["guesses"] == [int(r) for r in replies]
    first = session.calls[0].messages
    assert first[0]["content"] == f"{row['prompt']}\n\nGuess my number from 1 to 20. 5 guesses left."
    last = session.calls[-1].messages[-1]["content"]
    assert re.fullmatch(r"Too (low|high)\. \d guess(es)? left\.", last)  # the rendered observation


async def test_losing_episode_with_an_invalid_reply_scores_what_the_environment_gives(server):
    row = game(seed=3, max_guesses=3)
    got_last, replies, session = await episode(server, row, loser, action_field="guess",
                                               observation_template="{message}", max_turns=6)
    assert replies == ["0", "maybe five", "1", "1"]  # the secret (8) is not 1
    rewards, state = await direct(server, row["metadata"]["reset"], replies)
    assert not state["won"] and len(state["guesses"]) == 3 and rewards[0] == OUT_OF_RANGE
    assert got_last == rewards[-1] == 0.0
    # the invalid reply did not step the game; the policy was told why, in the environment's own words
    told = session.calls[2].messages[-1]["content"]
    assert told == "Invalid action: guess: Input should be a valid integer, unable to parse string as an integer"
    got_sum, replies2, _ = await episode(server, row, loser, action_field="guess", reward="sum", max_turns=6)
    assert replies2 == replies and got_sum == pytest.approx(sum(rewards)) == pytest.approx(OUT_OF_RANGE)


# ---- (b) concurrent episodes: each its own session and game ------------------------------------------------

async def test_concurrent_episodes_do_not_see_each_others_state(server, monkeypatch):
    open_now, most = set(), [0]

    class Counting(openenv_env._Client):  # how many of the adapter's sessions are open at once
        async def connect(self):
            out = await super().connect()
            open_now.add(id(self))
            most[0] = max(most[0], len(open_now))
            return out

        async def close(self):
            open_now.discard(id(self))
            await super().close()

    monkeypatch.setattr(openenv_env, "_Client", Counting)
    tok = char_tokenizer(QWEN_LIKE_TEMPLATE)
    seeds = [11, 12, 13, 14, 15, 16]
    rows = [game(s) for s in seeds]
    assert len({secret_for(s, 1, 20) for s in seeds}) >= 4
    scripts = [bisect, loser, bisect, loser, bisect, bisect]
    engines = [ScriptedEngine(tok, sc, token_delay_s=0.002) for sc in scripts]  # interleaved turns
    outs = await asyncio.gather(*[episode(server, r, None, engine=e, tok=tok, action_field="guess",
                                          observation_template="{message}", reward="sum")
                                  for r, e in zip(rows, engines, strict=True)])
    for row, script, (got, replies, _) in zip(rows, scripts, outs, strict=True):
        rewards, state = await direct(server, row["metadata"]["reset"], replies)
        assert got == pytest.approx(sum(rewards))
        assert state["won"] is (script is bisect)
    assert most[0] >= 4 and not open_now  # they did overlap, and every session was closed
    async with GenericEnvClient(base_url=server) as a, GenericEnvClient(base_url=server) as b:
        await a.reset(seed=1, high=1000)
        await b.reset(seed=2, high=1000)
        await a.step({"guess": 1})
        sa, sb = await a.state(), await b.state()
        assert sa["episode_id"] != sb["episode_id"] and sa["guesses"] == [1] and sb["guesses"] == []


async def test_a_one_session_server_serves_episodes_one_after_another_and_losing_it_fails_them(tmp_path):
    proc, url = _start_server(1, tmp_path / "server.log")
    try:
        outs = await asyncio.gather(*[episode(url, game(s), bisect, action_field="guess",
                                              observation_template="{message}") for s in (21, 22, 23)])
        assert [o[0] for o in outs] == [1.0, 1.0, 1.0]
        with pytest.raises(OpenEnvError, match="no free session for 0.3 s"):
            async with GenericEnvClient(base_url=url) as holder:
                await holder.reset()
                await episode(url, game(24), bisect, action_field="guess", capacity_wait_s=0.3)

        def dies(prompt: str, n: int) -> str:  # the server goes away in the middle of the episode
            if n == 1:
                proc.kill()
                proc.wait()
            return bisect(prompt, n)

        with pytest.raises(OpenEnvError, match=f"the OpenEnv session at {url} failed during step"):
            await episode(url, game(25), dies, action_field="guess")
    finally:
        _stop(proc)


# ---- (c) clear errors -----------------------------------------------------------------------------------------

async def test_a_server_that_is_down_fails_the_episode_saying_so():
    from rollout_service.agents.runners import EntryRunner
    from rollout_service.agents.session import EpisodeError, SessionStore

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(OpenEnvError, match=rf"cannot reach the OpenEnv server at {url} .*start it"):
        await episode(url, game(1), bisect, action_field="guess")
    tok = char_tokenizer(QWEN_LIKE_TEMPLATE)
    async with endpoint(ScriptedEngine(tok, bisect), tok) as srv:
        store: SessionStore = srv.store
        session = store.open(PromptTask(run="agents", prompt_id="g", epoch=0, payload=game(1)), 0)
        runner = EntryRunner(ENTRY, {"url": url, "action_field": "guess"})
        with pytest.raises(EpisodeError, match="raised OpenEnvError: cannot reach the OpenEnv server"):
            await runner(session, store)
        await runner.close()
    with pytest.raises(OpenEnvError, match="no OpenEnv server URL"):
        await episode("", game(1), bisect)


async def test_reset_refused_and_bad_arguments_are_clear(server):
    row = game(1)
    row["metadata"]["reset"].update(low=9, high=2)
    with pytest.raises(OpenEnvError, match=r"refused reset\(.*low 9 is above high 2 \(code EXECUTION_ERROR\)"):
        await episode(server, row, bisect, action_field="guess")
    with pytest.raises(OpenEnvError, match="reward='best': one of last, sum"):
        await episode(server, game(1), bisect, reward="best")


async def test_a_reply_that_is_no_action_ends_the_episode_with_zero_when_asked(server):
    def chatty(prompt: str, n: int) -> str:
        return "My guess is 10.<|im_end|>"

    got, replies, _ = await episode(server, game(5), chatty, action_field="guess", invalid_action="end")
    assert (got, replies) == (0.0, ["My guess is 10."])
    # the same reply is an action once a pattern picks the number out of it
    got, replies, session = await episode(server, game(5), chatty, action_field="guess", action_pattern=r"-?\d+",
                                          max_turns=2, observation_template="{message}")
    assert len(replies) == 2 and session.calls[1].messages[-1]["content"].startswith("Too ")
    # the wrong field: the server's own Action model says what is wrong
    got, replies, session = await episode(server, game(5), chatty, action_field="number", max_turns=2)
    told = session.calls[1].messages[-1]["content"]
    assert got == 0.0 and "guess: Field required" in told and "number: Extra inputs are not permitted" in told


def test_action_mapping_and_rendering():
    assert to_action(" 42\n", action_field="guess") == {"guess": "42"}
    assert to_action("I say 42 then 7", action_field="guess", action_pattern=r"(\d+)") == {"guess": "42"}
    with pytest.raises(ValueError, match="does not match"):
        to_action("none", action_field="guess", action_pattern=r"\d+")
    assert to_action('Sure: ```json\n{"guess": 3}\n```', "json", action_defaults={"metadata": {}}) == \
        {"metadata": {}, "guess": 3}
    assert to_action('move {"guess": 4} now', "json") == {"guess": 4}
    with pytest.raises(ValueError, match="no JSON object"):
        to_action("[1, 2]", "json")
    assert render({"message": "hi", "low": None}) == "hi"
    assert render({"message": "hi", "low": 1}) == "message: hi\nlow: 1"
    assert render({"message": "hi", "low": 1}, "{message} ({low}+)") == "hi (1+)"
    with pytest.raises(OpenEnvError, match="does not fit the observation"):
        render({"message": "hi"}, "{board}")
    env = GuessEnvironment()  # the environment's own rule, in process
    env.reset(seed=7, high=20)
    assert env.step(GuessAction(guess=secret_for(7, 1, 20))).reward == RIGHT


# ---- (d) jetrl up: the tiny policy trains a few steps on the environment's rewards ---------------------------

@pytest.mark.slow
async def test_jetrl_up_trains_on_the_environments_rewards(server, tmp_path):
    from shared.config import JetrlConfig
    from shared.io.jsonl import write_jsonl
    from shared.model.tinymodel import tiny_tokenizer_object

    rows = [{"prompt": f"Game {s}.", "reference": str(secret_for(s, 1, 9)),
             "metadata": {"reset": {"seed": s, "low": 1, "high": 9, "max_guesses": 3}}} for s in range(40)]
    data = write_jsonl(rows, tmp_path / "train.jsonl")
    tiny = tiny_tokenizer_object()
    digits = [tiny.token_to_id(str(d)) for d in range(1, 10)]  # the tiny policy can only reply 1..9
    cfg = JetrlConfig.model_validate({
        "run": "openenv", "nats": {"embedded": True}, "telemetry": {"events_interval_s": 1.0},
        "schedule": {"max_staleness": 2, "batch_size": 2, "total_steps": 2}, "reward": {"task": "maxdigit"},
        "rollout": {"workflow": "agent", "group_size": 4, "max_in_flight": 2,
                    "workflow_args": {"entry": ENTRY, "args": {"url": server, "action_field": "guess",
                                                               "observation_template": "{message}",
                                                               "max_turns": 3}},
                    "sampling": {"max_new_tokens": 1, "temperature": 1.0, "allowed_token_ids": digits},
                    "agent": {"timeout_s": 60}},
    })
    snap, ledger, page = await run_until_trained(cfg, tmp_path / "run", data, rollouts=50)
    assert len(snap["steps"]) >= 2 and int(ledger["trained"]) >= 2 * 2 and int(ledger.get("dead_lettered", 0)) == 0
    groups = page["items"]
    assert groups and all(g["workflow"] == "agent" for g in groups)
    seen = set()
    for g in groups:
        for s in g["samples"]:
            replies = [seg["text"] for seg in s["segments"] if seg["kind"] == "policy"]
            assert replies and all(re.fullmatch(r"[1-9]", r) for r in replies), (s["prompt"], [(x["kind"], x["text"]) for x in s["segments"]])
            game_seed = int(re.match(r"Game (\d+)\.", s["prompt"]).group(1))
            env = GuessEnvironment()  # replay the recorded replies on the environment itself
            env.reset(seed=game_seed, low=1, high=9, max_guesses=3)
            last = 0.0
            for r in replies:
                obs = env.step(GuessAction(guess=int(r)))
                last = obs.reward
            assert s["reward"] == pytest.approx(last), (game_seed, replies, s["reward"])
            seen.add(s["reward"])
    assert seen <= {0.0, RIGHT}
    for st in snap["steps"]:  # the trainer's mean reward is a share of won games: it trained on those rewards
        wins = st["reward_mean"] * st["samples"]
        assert st["samples"] >= 4 and abs(wins - round(wins)) < 1e-6, st
    log = (tmp_path / "run" / "logs" / "rollout.log").read_text()
    assert "workflow agent" in log
