import pytest

from shared.io.jsonl import json_objects


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


def test_strict_json_refuses_what_python_parses_badly(tmp_path):
    from shared.io.jsonl import JSONInputError, check_plain, loads_strict

    assert loads_strict('{"a": [1, 2.5, -3, 18446744073709551615]}') == {"a": [1, 2.5, -3, 2**64 - 1]}
    for text, why in (("[" * 200_000 + "]" * 200_000, "nested deeper"), ("[" * 65 + "]" * 65, "nested deeper"),
                      ("7" * 5000, "64-bit"), ("18446744073709551616", "64-bit"), ("NaN", "NaN"),
                      ('{"x": -Infinity}', "Infinity"), ("1e999", "Infinity"), ('{"a": ', "not valid JSON")):
        with pytest.raises(JSONInputError, match=why):
            loads_strict(text)
    with pytest.raises(JSONInputError, match="nan"):
        check_plain({"x": [float("nan")]})
    p = tmp_path / "a.jsonl"
    p.write_text('{"a": 1}\n{"a": NaN}\n')
    with pytest.raises(ValueError, match=r"a\.jsonl:2: not JSON \(NaN is not standard JSON"):
        list(json_objects(p))
