"""`jetrl eval --local-reward`: evaluation without NATS or any running service (before a run starts,
after it stopped). Scores in process with the reward service's own ScoringEngine and reads versions
from the weight store's directory; the rewards equal a direct greedy decode of the same weights."""

import hashlib
import subprocess
import sys

import pytest
from eval_helpers import direct_greedy_reward
from safetensors.torch import save_file

from launcher.demo.task import make_rows, write_jsonl
from rollout_service.evaluation.session import EvalError, eval_once, stored_versions
from shared.config import JetrlConfig
from shared.config.eval import EvalConfig
from shared.model.tinymodel import build_tiny_model
from weight_store.storage import Storage


def _store_version(root, run: str, version: int, state_dict: dict) -> None:
    """Commit `state_dict` as `version` of `run` in a weight store directory, as the service would."""
    st = Storage(root)
    part = st.new_part(run, version, "model.safetensors")
    save_file({k: v.contiguous() for k, v in state_dict.items()}, str(part))
    data = part.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    st.finish_part(run, version, "model.safetensors", part, len(data), digest)
    st.commit(run, version, [{"name": "model.safetensors", "size": len(data), "sha256": digest}])


@pytest.fixture
def setup(tmp_path):
    rows = make_rows(24, seed=7)
    path = write_jsonl(rows, tmp_path / "held.jsonl")
    cfg = JetrlConfig(run="evlocal")
    cfg.reward.task = "maxdigit"
    cfg.rollout.sampling.max_new_tokens = 1
    cfg.weights.root = str(tmp_path / "weights")
    cfg.weights.url = "http://127.0.0.1:9"  # nothing listens: every read must come from weights.root
    return cfg, EvalConfig(dataset=str(path)), rows


async def test_version_0_and_a_stored_version_match_direct_greedy_decodes_without_nats(setup):
    cfg, ecfg, rows = setup
    # No NATS server exists in this test: cfg.nats points at the default URL, nothing listens there.
    base, tok = build_tiny_model(cfg.model)
    res0 = await eval_once(cfg, ecfg, version=0, local_reward=True)
    assert (res0.version, res0.n, res0.k, res0.errors) == (0, 24, 1, 0)
    assert res0.reward == pytest.approx(direct_greedy_reward(base, tok, rows))
    assert len(res0.completions) == 24 and all(len(c) == 1 for c in res0.completions)

    other_cfg = cfg.model.model_copy(update={"seed": 3})
    other, _ = build_tiny_model(other_cfg)
    _store_version(cfg.weights.root, cfg.run, 4, other.state_dict())
    assert stored_versions(cfg) == [4]
    res4 = await eval_once(cfg, ecfg, version=None, local_reward=True)  # None = the newest stored
    assert (res4.version, res4.n) == (4, 24)
    assert res4.reward == pytest.approx(direct_greedy_reward(other, tok, rows))


async def test_a_version_missing_from_weights_root_is_a_clear_error(setup):
    cfg, ecfg, _ = setup
    with pytest.raises(EvalError, match="not in the weight store directory"):
        await eval_once(cfg, ecfg, version=7, local_reward=True)
    with pytest.raises(EvalError, match="NATS"):
        await eval_once(cfg, ecfg, version=0, emit=True, local_reward=True)


def test_cli_refuses_local_reward_with_follow(tmp_path):
    rows = make_rows(2, seed=1)
    path = write_jsonl(rows, tmp_path / "held.jsonl")
    cfgfile = tmp_path / "c.yaml"
    cfgfile.write_text("reward: {task: maxdigit}\n")
    out = subprocess.run([sys.executable, "-m", "launcher.cli", "eval", "-c", str(cfgfile), "--dataset", str(path),
                          "--local-reward", "--follow"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--local-reward" in out.stderr
