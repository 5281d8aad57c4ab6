import pytest

from shared.jsonl import json_objects


def test_objects_with_their_line_and_errors_naming_the_line(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_text('{"a": 1}\n\n{"b": 2}\n')
    assert list(json_objects(p)) == [(f"{p}:1", {"a": 1}), (f"{p}:3", {"b": 2})]
    p.write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(ValueError, match=r"a\.jsonl:2: not JSON"):
        list(json_objects(p))
    p.write_text('[1, 2]\n')
    with pytest.raises(ValueError, match=r"a\.jsonl:1: a line must be a JSON object, got list"):
        list(json_objects(p))
