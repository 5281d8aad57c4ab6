"""pass@k and the evaluation summary, against values worked out by hand; held-out file errors."""

import pytest

from rollout_service.evaluation.passk import pass_at_k, summarise
from rollout_service.evaluation.rows import read_rows
from shared.config.eval import EvalConfig


def test_pass_at_k_matches_hand_computed_values():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 1, 4) == 1.0
    # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)


def test_summary_of_two_prompts_with_four_samples():
    r = summarise(7, [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], success=1.0)
    assert (r.version, r.n, r.k) == (7, 2, 4)
    assert r.reward == pytest.approx(1 / 8)
    assert r.pass_at_1 == pytest.approx(0.125)
    assert r.pass_at_k == pytest.approx(0.5)
    assert set(r.event_data()) >= {"version", "reward", "pass_at_k", "n"}


def test_read_rows_maps_gsm8k_fields_and_names_the_bad_line(tmp_path):
    p = tmp_path / "h.jsonl"
    p.write_text('{"question": "1+1?", "answer": "#### 2"}\n\n{"question": "x"}\n')
    with pytest.raises(ValueError, match=r"h.jsonl:3: no reference field"):
        read_rows(p, EvalConfig())
    p.write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": "2+2?", "answer": "#### 4"}\n')
    rows = read_rows(p, EvalConfig(limit=1))
    assert rows == [{"prompt": "1+1?", "reference": "#### 2", "metadata": {}}]


def test_read_rows_takes_a_rows_metadata_object_as_the_metadata(tmp_path):
    p = tmp_path / "h.jsonl"
    p.write_text('{"prompt": "q", "reference": "a", "metadata": {"corpus": "/c.jsonl"}, "src": "x"}\n'
                 '{"prompt": "r", "reference": "b", "metadata": "plain text"}\n')
    rows = read_rows(p, EvalConfig())
    assert rows[0]["metadata"] == {"corpus": "/c.jsonl", "src": "x"}
    assert rows[1]["metadata"] == {"metadata": "plain text"}  # not an object: a key like any other column


def test_greedy_with_several_samples_is_a_config_error():
    with pytest.raises(ValueError, match="eval.greedy"):
        EvalConfig(samples=4, greedy=True)
