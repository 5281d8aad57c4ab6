"""`jetrl eval` on the tiny model: the engine + reward-service path gives exactly the reward a direct
greedy decode of the same weights scored locally gives, and the result is published as an eval Event."""

import subprocess
import sys
import time

import pytest
from eval_helpers import direct_greedy_reward

from launcher.demo.task import make_rows, write_jsonl
from rollout_service.evaluation.session import eval_once
from shared.config import JetrlConfig
from shared.config.eval import EvalConfig
from shared.contract import subjects
from shared.contract.codec import decode
from shared.contract.messages import Event
from shared.model.tinymodel import load_policy

pytestmark = pytest.mark.slow


@pytest.fixture
def reward_service(nats_config, tmp_path):
    cfgfile = tmp_path / "r.yaml"
    cfgfile.write_text(f"nats: {{servers: ['{nats_config.servers[0]}']}}\nreward: {{task: maxdigit}}\n")
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "reward", "serve", "-c", str(cfgfile)])
    yield
    proc.terminate()
    proc.wait(30)


async def test_eval_of_version_0_matches_a_direct_greedy_decode(nats_config, nc, js, reward_service, tmp_path):
    rows = make_rows(40, seed=5)
    path = write_jsonl(rows, tmp_path / "held.jsonl")
    cfg = JetrlConfig(run="evtiny", nats=nats_config)
    cfg.reward.task = "maxdigit"
    cfg.rollout.sampling.max_new_tokens = 1
    sub = await js.pull_subscribe(subjects.events(cfg.run, "eval"), durable="t-eval")
    deadline = time.monotonic() + 60
    while True:  # the reward service subprocess needs a moment to subscribe
        try:
            res = await eval_once(cfg, EvalConfig(dataset=str(path)), version=0, emit=True)
            break
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
    assert (res.version, res.n, res.k, res.errors) == (0, 40, 1, 0)
    assert res.reward == pytest.approx(direct_greedy_reward(*load_policy(cfg.model), rows))
    assert res.pass_at_1 == pytest.approx(res.reward)
    msgs = await sub.fetch(1, timeout=10)
    ev = decode(msgs[0].data, expect=Event)
    assert (ev.service, ev.kind, ev.data["version"], ev.data["n"]) == ("eval", "eval", 0, 40)
    assert ev.data["reward"] == pytest.approx(res.reward)
