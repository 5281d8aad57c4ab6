"""Dataset reading, field mapping, validation with line numbers, and content-hash identity."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from ci_gate import need_module
from controller_helpers import maxdigit_rows, write_jsonl

from controller import datasets as ds
from controller import sources


def norm_jsonl(path, out, mapping=None, **kw):
    return ds.normalize(ds.read_jsonl(path, 1 << 20), mapping or ds.FieldMapping(), out, **kw)


def test_jsonl_rows_become_payloads_with_detected_mapping(tmp_path):
    p = write_jsonl(tmp_path / "a.jsonl", maxdigit_rows(5))
    n = norm_jsonl(p, tmp_path / "out")
    assert n.num_rows == 5
    assert n.mapping.prompt == "question" and n.mapping.reference == "answer" and n.mapping.metadata == ["idx"]
    r = ds.DatasetReader(n.path)
    first = maxdigit_rows(5)[0]
    assert r.payload(0) == {"prompt": first["question"], "reference": first["answer"], "metadata": {"idx": 0}}
    assert len(r) == 5
    r.close()


def test_chat_messages_mapping_and_explicit_columns(tmp_path):
    rows = [{"conv": [{"role": "user", "content": "max 1 2 ="}], "gold": 2, "src": "x", "junk": 1}]
    p = write_jsonl(tmp_path / "c.jsonl", rows)
    m = ds.FieldMapping(messages="conv", reference="gold", metadata=["src"])
    n = norm_jsonl(p, tmp_path / "out", m)
    payload = ds.DatasetReader(n.path).payload(0)
    assert payload == {"messages": [{"role": "user", "content": "max 1 2 ="}], "reference": 2, "metadata": {"src": "x"}}


def test_a_rows_metadata_object_is_the_payloads_metadata(tmp_path):
    # the search and customer-service agents' data: {"prompt", "reference", "metadata": {...}}; an agent reads
    # task["metadata"]["corpus"] (it was nested one level deeper, and every episode failed with KeyError)
    rows = [{"prompt": "q", "reference": "a", "metadata": {"corpus": "/c.jsonl", "hop": 1}, "hop": 2}]
    n = norm_jsonl(write_jsonl(tmp_path / "m.jsonl", rows), tmp_path / "out")
    payload = ds.DatasetReader(n.path).payload(0)
    assert payload["metadata"] == {"corpus": "/c.jsonl", "hop": 2}  # a column of its own wins over the object's key


def test_broken_json_line_is_reported_with_its_line_number(tmp_path):
    p = tmp_path / "b.jsonl"
    p.write_text('{"prompt": "a", "reference": "1"}\n\n{"prompt": "b", "reference": \n{"prompt": "c", "reference": "3"}\n')
    with pytest.raises(ds.DatasetError) as e:
        norm_jsonl(p, tmp_path / "out")
    assert e.value.message.startswith("line 3:")
    assert "not valid JSON" in e.value.message
    assert e.value.errors[0]["line"] == 3
    assert not list((tmp_path / "out").glob("*.jsonl")), "nothing is registered from a bad file"


def test_missing_field_and_wrong_type_name_line_and_field(tmp_path):
    rows = [{"prompt": "ok", "reference": "1"}, {"reference": "2"}, {"prompt": 7, "reference": "3"},
            {"prompt": "ok", "reference": None}]
    p = write_jsonl(tmp_path / "m.jsonl", rows)
    with pytest.raises(ds.DatasetError) as e:
        norm_jsonl(p, tmp_path / "out")
    errs = e.value.errors
    assert [x["line"] for x in errs] == [2, 3, 4]
    assert "missing field 'prompt'" in errs[0]["error"]
    assert "must be a string, got integer" in errs[1]["error"]
    assert errs[2]["field"] == "reference" and "null" in errs[2]["error"]
    assert "first 3 bad rows" in e.value.message


def test_errors_stop_at_max_errors(tmp_path):
    p = write_jsonl(tmp_path / "m.jsonl", [{"prompt": 1, "reference": "x"}] * 50)
    with pytest.raises(ds.DatasetError) as e:
        norm_jsonl(p, tmp_path / "out", max_errors=4)
    assert len(e.value.errors) == 4


def test_empty_file_and_blank_lines_are_rejected(tmp_path):
    for text in ("", "\n\n  \n"):
        p = tmp_path / "e.jsonl"
        p.write_text(text)
        with pytest.raises(ds.DatasetError, match="no rows"):
            norm_jsonl(p, tmp_path / "out")


def test_non_object_line_and_bad_utf8(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes(b'[1, 2]\n{"prompt": "\xff\xfe"}\n')
    with pytest.raises(ds.DatasetError) as e:
        norm_jsonl(p, tmp_path / "out")
    assert e.value.errors[0]["line"] == 1 and "JSON object" in e.value.errors[0]["error"]
    assert e.value.errors[1]["line"] == 2


def test_overlong_line_is_skipped_and_named(tmp_path):
    p = tmp_path / "long.jsonl"
    with open(p, "w") as f:
        f.write(json.dumps({"prompt": "a", "reference": "1"}) + "\n")
        f.write(json.dumps({"prompt": "x" * 5000, "reference": "1"}) + "\n")
        f.write("{broken\n")
    with pytest.raises(ds.DatasetError) as e:
        ds.normalize(ds.read_jsonl(p, 1000), ds.FieldMapping(), tmp_path / "out")
    assert e.value.errors[0]["line"] == 2 and "over the limit of 1000 bytes" in e.value.errors[0]["error"]
    assert e.value.errors[1]["line"] == 3


def test_no_prompt_column_says_which_columns_exist(tmp_path):
    p = write_jsonl(tmp_path / "n.jsonl", [{"text": "a", "gold": "1"}])
    with pytest.raises(ds.DatasetError, match=r"no prompt column found among \['text', 'gold'\]: set mapping.prompt"):
        norm_jsonl(p, tmp_path / "out")


def test_parquet_and_jsonl_with_same_rows_are_one_dataset(tmp_path):
    rows = maxdigit_rows(20)
    pj = write_jsonl(tmp_path / "d.jsonl", rows)
    pp = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), pp)
    assert ds.sniff_format(pp) == "parquet" and ds.sniff_format(tmp_path / "d.jsonl") == "jsonl"
    a = norm_jsonl(pj, tmp_path / "out")
    b = ds.normalize(ds.read_parquet(pp), ds.FieldMapping(), tmp_path / "out")
    assert a.content_hash == b.content_hash and b.num_rows == 20


def test_parquet_bad_row_is_named_by_row_number(tmp_path):
    pp = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "a", "reference": "1"}, {"prompt": "", "reference": "2"}]), pp)
    with pytest.raises(ds.DatasetError, match="row 2: field 'prompt': field 'prompt' is empty"):
        ds.normalize(ds.read_parquet(pp), ds.FieldMapping(), tmp_path / "out", unit="row")


def test_corrupt_parquet_is_a_dataset_error(tmp_path):
    pp = tmp_path / "c.parquet"
    pp.write_bytes(b"PAR1" + b"\0" * 100)
    with pytest.raises(ds.DatasetError, match="Parquet"):
        ds.normalize(ds.read_parquet(pp), ds.FieldMapping(), tmp_path / "out")


def test_hugging_face_loader_reads_local_json_and_parquet(tmp_path):
    need_module("datasets", "jetrl[datasets]")
    rows = maxdigit_rows(12)
    pj = write_jsonl(tmp_path / "hf.jsonl", rows)
    pp = tmp_path / "hf.parquet"
    pq.write_table(pa.Table.from_pylist(rows), pp)
    cache = str(tmp_path / "hf-cache")
    a = ds.normalize(sources.read_hf("json", "train", data_files=[pj], cache_dir=cache), ds.FieldMapping(), tmp_path / "o")
    b = ds.normalize(sources.read_hf("parquet", "train", data_files=[str(pp)], cache_dir=cache), ds.FieldMapping(),
                     tmp_path / "o")
    c = norm_jsonl(pj, tmp_path / "o")
    assert a.num_rows == 12 and a.content_hash == b.content_hash == c.content_hash


def test_hugging_face_missing_dataset_is_a_clear_error(tmp_path):
    need_module("datasets", "jetrl[datasets]")
    with pytest.raises(ds.DatasetError, match="cannot load Hugging Face dataset 'json'") as err:
        list(sources.read_hf("json", "train", data_files=[str(tmp_path / "nope.jsonl")], cache_dir=str(tmp_path / "c")))
    assert str(tmp_path) not in err.value.message  # no host path in the answer
