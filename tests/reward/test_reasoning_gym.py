"""The reasoning_gym reward task (reward_service/scorers/reasoning_gym.py) and its data CLI
(examples/reasoning_gym/data.py): for two reasoning-gym tasks the reward is reasoning-gym's own
`score_answer` on the same answer, for right, wrong and garbage completions; references round-trip through
the JSONL rows; bad references and hostile completions are Score errors or plain scores, never exceptions or
hangs; tasks whose scorer evaluates the answer as code are refused."""

from __future__ import annotations

import json
import random
import string
import time
from pathlib import Path

import pytest

from tests.ci_gate import need_module

rg = need_module("reasoning_gym", 'pip install "reasoning-gym>=0.1.25" (or the frameworks extra)')

from reasoning_gym.utils import extract_answer as rg_extract  # noqa: E402

from examples.reasoning_gym import data as rg_data  # noqa: E402
from reward_service.engine import ScoringEngine  # noqa: E402
from reward_service.scorers import BUILTIN, MODES, load_scorer  # noqa: E402
from reward_service.scorers import reasoning_gym as scorer  # noqa: E402
from shared.config.reward import RewardConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TASKS = ("leg_counting", "basic_arithmetic")
N = 25


def entries(task: str, seed: int = 3) -> tuple[dict, list[dict]]:
    config = {"size": N, "seed": seed}
    ds = rg.create_dataset(task, **config)
    return config, [ds[i] for i in range(N)]


def reference(task: str, config: dict, entry: dict) -> dict:
    return json.loads(json.dumps({"task": task, "config": config, "entry": entry}))


def wrong(answer: str) -> str:
    try:
        return str(int(answer) + 1)
    except ValueError:
        return answer + "1"


def transcripts(entry: dict, rng: random.Random) -> dict[str, str]:
    a = entry["answer"]
    junk = "".join(rng.choice(string.printable) for _ in range(rng.randint(1, 200)))
    return {
        "right": f"Let me count step by step.\n<answer>{a}</answer>",
        "right_spaced": f"<answer> {a} </answer>\nDone.",
        "wrong": f"I think it is\n<answer>{wrong(a)}</answer>",
        "garbage_tag": f"<answer>{junk}</answer>",
        "two_tags": f"<answer>{wrong(a)}</answer> no wait <answer>{a}</answer>",
        "right_in_text_tag": f"<answer>The total is {a}</answer>",
    }


@pytest.mark.parametrize("task", TASKS)
def test_reward_is_reasoning_gyms_own_score_on_the_same_transcript(task):
    config, items = entries(task)
    ds = rg.create_dataset(task, **config)
    generic = rg.get_score_answer_fn(task)  # reasoning-gym's own re-scoring entry point
    rng = random.Random(0)
    seen = {"right": set(), "wrong": set()}
    for entry in items:
        ref = reference(task, config, entry)
        for kind, completion in transcripts(entry, rng).items():
            got = scorer.score(completion, ref, {})
            want = ds.score_answer(rg_extract(completion), entry)  # reasoning-gym's own extraction and scorer
            assert got.error is None, (kind, got.error)
            assert got.reward == want == generic(rg_extract(completion), entry), (task, kind, completion)
            assert got.metrics == {f"task:{task}": 1.0, "format:tag": 1.0}
            seen.setdefault(kind, set()).add(got.reward)
    assert seen["right"] == {1.0} and seen["right_spaced"] == {1.0} and seen["two_tags"] == {1.0}
    assert seen["wrong"] == {0.0}


@pytest.mark.parametrize("task", TASKS)
def test_untagged_completions_use_the_last_line_and_random_text_scores_like_reasoning_gym(task):
    config, items = entries(task, seed=11)
    ds = rg.create_dataset(task, **config)
    rng = random.Random(1)
    for entry in items:
        ref = reference(task, config, entry)
        junk = "".join(rng.choice(string.ascii_letters + string.digits + " \n") for _ in range(300))
        cases = {
            f"Thinking...\n{entry['answer']}\n\n": entry["answer"],
            f"{wrong(entry['answer'])}": wrong(entry["answer"]),
            junk: junk.rstrip().rsplit("\n", 1)[-1].strip(),
            f"so the answer is {entry['answer']}": f"so the answer is {entry['answer']}",  # partial credit
        }
        for completion, answer in cases.items():
            got = scorer.score(completion, ref, {})
            assert got.error is None
            assert got.metrics[f"format:{'last_line' if answer else 'none'}"] == 1.0
            assert got.reward == ds.score_answer(answer or None, entry), (task, completion)
        empty = scorer.score("  \n ", ref, {})
        assert empty.error is None and empty.metrics["format:none"] == 1.0
        assert empty.reward == ds.score_answer(None, entry) == 0.0


def test_builtin_registration_and_mode():
    assert BUILTIN["reasoning_gym"] == "reward_service.scorers.reasoning_gym:score"
    assert MODES["reasoning_gym"] == "process"
    assert load_scorer("reasoning_gym") is scorer.score


async def test_scored_through_the_engines_process_pool():
    cfg = RewardConfig(task="reasoning_gym", processes=1, scorer_timeout_s=20.0)
    engine = ScoringEngine(cfg)
    assert engine.mode == "process"
    config, items = entries("leg_counting")
    entry = items[0]
    ref = reference("leg_counting", config, entry)
    await engine.start()
    try:
        comps = [f"<answer>{entry['answer']}</answer>", f"<answer>{wrong(entry['answer'])}</answer>", "x" * 2_000_000]
        scores = await engine.score_group(comps, ref, {})
    finally:
        await engine.close()
    assert [s.reward for s in scores] == [1.0, 0.0, 0.0]
    assert all(s.error is None for s in scores)


BAD_REFERENCES = {
    "none": None,
    "number": 7,
    "not_json": "leg_counting",
    "no_task": {"entry": {"question": "q", "answer": "1", "metadata": {}}},
    "no_entry": {"task": "leg_counting"},
    "entry_without_answer": {"task": "leg_counting", "entry": {"question": "q"}},
    "bad_metadata": {"task": "leg_counting", "entry": {"question": "q", "answer": "1", "metadata": [1]}},
    "unknown_task": {"task": "no_such_task", "entry": {"question": "q", "answer": "1", "metadata": {}}},
    "bad_config_type": {"task": "leg_counting", "config": [1], "entry": {"question": "q", "answer": "1"}},
    "bad_config_value": {"task": "leg_counting", "config": {"size": {"x": 1}}, "entry": {"answer": "1"}},
    "config_the_task_refuses": {"task": "leg_counting", "config": {"min_animals": 0}, "entry": {"answer": "1"}},
    "config_unknown_key": {"task": "leg_counting", "config": {"nope": 1}, "entry": {"answer": "1"}},
    "unsafe_task": {"task": "string_insertion", "entry": {"question": "q", "answer": "ab", "metadata": {}}},
}


@pytest.mark.parametrize("name", sorted(BAD_REFERENCES))
def test_bad_references_are_score_errors_not_exceptions(name):
    got = scorer.score("<answer>1</answer>", BAD_REFERENCES[name], {})
    assert got.reward == 0.0 and got.error, name


def test_a_scorer_that_fails_on_the_entry_is_an_error():
    # leg_counting scores with the base rule: an entry whose answer is not a string makes it raise
    got = scorer.score("<answer>1</answer>", {"task": "leg_counting", "entry": {"answer": 1, "metadata": {}}}, {})
    assert got.reward == 0.0 and "score_answer raised" in got.error


def test_tasks_whose_scorer_evaluates_the_answer_are_refused():
    for task in ("string_insertion", "spiral_matrix", "n_queens", "polynomial_equations", "countdown"):
        assert scorer.unsafe_reason(task), task
    for task in TASKS:
        assert scorer.unsafe_reason(task) is None
    # the refused task's scorer really would run the answer: its source calls eval on it
    got = scorer.score("<answer>__import__('os').getpid()</answer>",
                       {"task": "string_insertion", "entry": {"question": "q", "answer": "ab", "metadata": {}}}, {})
    assert got.error and "can run a completion's text as code" in got.error


HOSTILE = {
    "huge": "7" * 5_000_000,
    "many_opens": "<answer>" * 300_000,
    "many_closes": "</answer>" * 300_000,
    "nested_opens": "<answer>" * 100_000 + "12" + "</answer>",
    "unicode": "<answer>\u202e\u0000\ud800\U0001f600\ufeff٣٤</answer>",
    "surrogates_untagged": "\ud800\udfff\n" * 1000,
    "control": "\x00\x1b[2J\r\n" * 100_000,
    "long_lines": ("a" * 100_000 + "\n") * 20,
    "code": "<answer>__import__('os').system('echo pwned')</answer>",
}


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_completions_score_quickly_without_error(task, name):
    config, items = entries(task)
    ref = reference(task, config, items[0])
    t0 = time.perf_counter()
    got = scorer.score(HOSTILE[name], ref, {})
    assert time.perf_counter() - t0 < 2.0, name
    assert got.error is None and 0.0 <= got.reward <= 1.0
    assert got.reward < 1.0 or name == "nested_opens"


def test_data_cli_writes_disjoint_splits_whose_references_round_trip(tmp_path):
    rg_data.main(["--tasks", ",".join(TASKS), "--size", "40", "--heldout", "10", "--seed", "5", "--out", str(tmp_path)])
    train = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    held = [json.loads(line) for line in (tmp_path / "heldout.jsonl").read_text().splitlines()]
    assert len(train) == 80 and len(held) == 20
    for rows, split in ((train, "train"), (held, "heldout")):
        assert {r["metadata"]["task"] for r in rows} == set(TASKS)
        assert all(r["metadata"]["split"] == split for r in rows)
    assert not {r["reference"]["entry"]["question"] for r in train} & {r["reference"]["entry"]["question"] for r in held}
    assert {r["reference"]["config"]["seed"] for r in train} == {5}
    assert {r["reference"]["config"]["seed"] for r in held} == {5 + rg_data.HELDOUT_SEED_OFFSET}
    for r in train + held:
        ref = r["reference"]
        task, config, entry = ref["task"], ref["config"], ref["entry"]
        again = rg.create_dataset(task, **config)[entry["metadata"]["source_index"]]
        assert json.loads(json.dumps(again)) == entry  # the stored entry is the generated one, as plain JSON
        assert r["prompt"].startswith(entry["question"].rstrip()) and scorer.INSTRUCTION in r["prompt"]
        right = scorer.score(f"<answer>{entry['answer']}</answer>", ref, {})
        assert right.reward == 1.0 and right.error is None
        assert scorer.score(f"<answer>{wrong(entry['answer'])}</answer>", ref, {}).reward == \
            rg.create_dataset(task, **config).score_answer(wrong(entry["answer"]), again)
    # the same arguments write the same files
    rg_data.main(["--tasks", ",".join(TASKS), "--size", "40", "--heldout", "10", "--seed", "5", "--out", str(tmp_path / "b")])
    assert (tmp_path / "b" / "train.jsonl").read_bytes() == (tmp_path / "train.jsonl").read_bytes()


def test_data_cli_refuses_unknown_and_unsafe_tasks(tmp_path, capsys):
    with pytest.raises(SystemExit, match="unknown reasoning-gym task"):
        rg_data.main(["--tasks", "no_such_task", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="can run a completion's text as code"):
        rg_data.main(["--tasks", "leg_counting,string_insertion", "--out", str(tmp_path)])
    assert not (tmp_path / "train.jsonl").exists()
    rg_data.main(["--list"])
    listed = capsys.readouterr().out.split()
    assert set(TASKS) <= set(listed) and "string_insertion" not in listed


def test_example_config_uses_the_task_and_the_cli_data():
    import yaml

    from shared.config import JetrlConfig, load_config

    path = ROOT / "examples" / "reasoning_gym_smollm2.yaml"
    cfg = load_config(JetrlConfig, str(path))
    assert cfg.reward.task == "reasoning_gym" and cfg.model.path == "jetrl-models/smollm2-135m"
    raw = yaml.safe_load(path.read_text())
    assert raw["launch"]["dataset"] == "examples/data/reasoning_gym/train.jsonl"
    assert raw["eval"]["dataset"] == "examples/data/reasoning_gym/heldout.jsonl"
