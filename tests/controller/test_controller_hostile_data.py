"""Hostile data against the live controller: every path a Hugging Face builder reads is confined to
controller.path_roots (relative, `..`, absolute, glob and symlink escapes, one answer for missing and
forbidden), what the controller writes is 0600 in 0700 dirs, decompression bombs (Parquet, gzip JSONL)
stop at the limit while reading, JSON that Python parses badly (deep, huge integers, NaN) is a 4xx naming
the line, and the API docs load nothing from a CDN (no /docs; /openapi.json needs the token)."""

from __future__ import annotations

import gzip
import io
import json
import os
import resource
import stat
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from ci_gate import need_module
from controller_helpers import AUTH, write_jsonl

from controller import datasets as ds
from controller import sources

SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
MB = 1 << 20


def _detail(r: httpx.Response, sent: str) -> str:
    assert r.status_code == 403, (sent, r.status_code, r.text)
    return r.json()["detail"].replace(repr(sent), "PATH")


@SQLITE
async def test_every_builder_reads_only_files_under_path_roots(live, tmp_path, monkeypatch):
    need_module("datasets", "jetrl[datasets]")
    allowed, outside = tmp_path / "allowed", tmp_path / "jetrl-runs" / "r1" / "secrets"
    allowed.mkdir()
    outside.mkdir(parents=True)
    (outside / "token").write_text("secret-token-value\n")
    (allowed / "link").symlink_to(outside / "token")
    (allowed / "sub").mkdir()
    (allowed / "sub" / "escape").symlink_to(outside / "token")
    monkeypatch.chdir(tmp_path)  # the tester's setup: the secrets lie under the controller's working dir
    live.ctl.ccfg.path_roots = [str(allowed)]
    answers = set()
    for path in ("jetrl-runs/*/secrets/*",  # relative: from the first root, not the working dir
                 "jetrl-runs/r1/secrets/token", f"{allowed}/../jetrl-runs/r1/secrets/token",  # ..
                 str(outside / "token"), "/etc/passwd",  # absolute outside
                 f"{allowed}/../jetrl-runs/*/secrets/*", "../jetrl-runs/*/secrets/*",  # globs escaping
                 str(allowed / "link"), "link", "sub/*",  # symlinks escaping, by name and by glob
                 "missing.txt", str(allowed / "missing.txt"), "no-*-match",  # missing inside the roots
                 "http://127.0.0.1:1/x.jsonl", "hf://datasets/x/y/z.jsonl"):  # remote: refused
        r = await live.http.post("/v1/datasets/hf", json={"name": "text", "data_files": [path]})
        d = _detail(r, path)
        assert "secret" not in d and str(tmp_path) not in d.replace(str(allowed), "")
        answers.add(d)
    assert len(answers) == 1, answers  # missing and forbidden cannot be told apart
    for builder in sorted(sources.builders()):  # every packaged builder, not an allow-list
        r = await live.http.post("/v1/datasets/hf", json={"name": builder, "data_files": ["/etc/passwd"]})
        assert r.status_code == 403, (builder, r.text)
    assert {"json", "parquet", "text", "csv", "xml"} <= sources.builders()  # (no conll: datasets 4.6, which verifiers 0.2.0 pins, lacks it)
    # a hub id is never a directory of the working dir, even when one of that name exists
    (tmp_path / "gsm8k").mkdir()
    write_jsonl(tmp_path / "gsm8k" / "train.jsonl", [{"question": "secret q", "answer": "1"}])
    import datasets.config
    import huggingface_hub.constants
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    r = await live.http.post("/v1/datasets/hf", json={"name": "gsm8k"})
    assert r.status_code == 422 and "secret" not in r.text, r.text
    assert (await live.http.get("/v1/datasets")).json() == []  # nothing was registered
    # inside the roots: relative names, globs and a local dataset dir work
    write_jsonl(allowed / "ok.jsonl", [{"q": "max 1 2 =", "a": "2"}])
    body = {"name": "json", "mapping": {"prompt": "q", "reference": "a"}}
    r = await live.http.post("/v1/datasets/hf", json={**body, "data_files": ["ok.jsonl"]})
    assert r.status_code == 201, r.text
    r = await live.http.post("/v1/datasets/hf", json={**body, "data_files": [str(allowed / "*.jsonl")]})
    assert r.status_code == 200 and r.json()["num_rows"] == 1, r.text  # the same rows: the same dataset
    (allowed / "dsdir").mkdir()
    write_jsonl(allowed / "dsdir" / "train.jsonl", [{"q": "max 1 2 =", "a": "2"}])
    r = await live.http.post("/v1/datasets/hf", json={"name": "./dsdir", "mapping": body["mapping"]})
    assert r.status_code == 200, r.text
    (allowed / "dsdir" / "train-2.jsonl").symlink_to(outside / "token")  # a split file escaping
    r = await live.http.post("/v1/datasets/hf", json={"name": "./dsdir", "mapping": body["mapping"]})
    assert r.status_code == 403, r.text
    # no roots: no local file at all
    live.ctl.ccfg.path_roots = []
    r = await live.http.post("/v1/datasets/hf", json={**body, "data_files": ["ok.jsonl"]})
    assert r.status_code == 403 and "path_roots is empty" in r.json()["detail"]
    # what the controller wrote is its user's only
    data = Path(live.cfg.controller.data_dir)
    for root, _dirs, files in os.walk(data):
        assert stat.S_IMODE(os.stat(root).st_mode) == 0o700, root
        for f in files:
            assert stat.S_IMODE(os.stat(Path(root) / f).st_mode) == 0o600, f
    assert any((data / "datasets").iterdir())


def _parquet_bomb(path: Path, rows: int = 50, row_mb: int = 8) -> None:
    """`rows` rows pointing at one dictionary entry of `row_mb` MB: a few KB on disk."""
    col = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["a" * (row_mb * MB)]))
    pq.write_table(pa.table({"prompt": col}), path, compression="zstd", use_dictionary=True)


def test_a_parquet_bomb_is_refused_after_its_first_mib_is_counted(tmp_path):
    bomb = tmp_path / "bomb.parquet"
    _parquet_bomb(bomb)
    assert bomb.stat().st_size < 4096
    budget = ds.ReadBudget(4096 * MB, 100.0, bomb.stat().st_size)
    with pytest.raises(ds.DatasetError, match="max_expansion_ratio") as err:
        for _ in ds.read_parquet(bomb, budget, 8 * MB + 64):
            pass
    assert err.value.status == 413 and budget.limit == MB
    assert budget.used <= budget.limit + 8 * MB + 64  # stopped at the first row past the limit, not after 400 MB
    budget = ds.ReadBudget(20 * MB)  # the total limit alone (ratio off) stops it too, still while reading
    rows = []
    with pytest.raises(ds.DatasetError, match="max_dataset_mb"):
        for _, row in ds.read_parquet(bomb, budget, 9 * MB):
            rows.append(len(row["prompt"]))
    assert len(rows) == 2 and budget.used <= 20 * MB + 9 * MB


def _gzip_bomb(path: Path, lines: int = 100, line_mb: int = 1) -> None:
    line = (json.dumps({"prompt": "a" * (line_mb * MB)}) + "\n").encode()
    with gzip.open(path, "wb", compresslevel=1) as f:
        for _ in range(lines):
            f.write(line)


def test_a_gzip_jsonl_bomb_stops_while_it_is_decompressed(tmp_path):
    bomb = tmp_path / "bomb.jsonl.gz"
    _gzip_bomb(bomb)
    size = bomb.stat().st_size
    assert size < 2 * MB  # 100 MB of rows
    budget = ds.ReadBudget(4096 * MB, 10.0, size)
    seen = 0
    with pytest.raises(ds.DatasetError, match="max_expansion_ratio") as err:
        for _ in ds.read_jsonl(bomb, 8 * MB, budget):
            seen += 1
    assert err.value.status == 413 and budget.used <= max(10 * size, MB) + 2 * MB and seen < 100


@SQLITE
async def test_uploaded_bombs_get_a_413_and_the_controller_does_not_balloon(live, tmp_path):
    pbomb, gbomb = tmp_path / "bomb.parquet", tmp_path / "bomb.jsonl.gz"
    _parquet_bomb(pbomb)
    _gzip_bomb(gbomb, lines=300)  # 300 MB decompressed
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB; the controller runs in this process
    for p in (pbomb, gbomb):
        r = await live.http.post("/v1/datasets", files={"file": (p.name, p.read_bytes())})
        assert r.status_code == 413, r.text
        assert "max_expansion_ratio" in r.json()["detail"]
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
    assert grown_mb < 150, grown_mb  # the issue's upload took 898 MB
    live.ctl.ccfg.max_expansion_ratio = 0  # the total limit alone
    live.ctl.ccfg.max_dataset_mb = 16
    r = await live.http.post("/v1/datasets", files={"file": (pbomb.name, pbomb.read_bytes())})
    assert r.status_code == 413 and "max_dataset_mb" in r.json()["detail"], r.text
    assert (await live.http.get("/v1/datasets")).json() == []
    # an honest gzip JSONL upload works
    buf = io.BytesIO()
    with gzip.open(buf, "wb") as f:
        f.write(b'{"question": "max 1 2 =", "answer": "2"}\n')
    r = await live.http.post("/v1/datasets", files={"file": ("d.jsonl.gz", buf.getvalue())})
    assert r.status_code == 201 and r.json()["num_rows"] == 1, r.text


@SQLITE
async def test_json_python_parses_badly_is_a_4xx_naming_the_line(live):
    lines = [
        '{"prompt": "ok"}',
        '{"prompt": "deep", "x": ' + "[" * 200_000 + "]" * 200_000 + "}",
        '{"prompt": "big", "n": ' + "7" * 5000 + "}",
        '{"prompt": "nan", "x": NaN}',
        '{"prompt": "inf", "x": -Infinity}',
        '{"prompt": "overflow", "x": 1e999}',
        '{"prompt": "not so deep", "x": ' + "[" * 100 + "]" * 100 + "}",
    ]
    r = await live.http.post("/v1/datasets", files={"file": ("d.jsonl", "\n".join(lines).encode())})
    assert r.status_code == 422, r.text[:500]
    errs = {e["line"]: e["error"] for e in r.json()["errors"]}
    assert set(errs) == {2, 3, 4, 5, 6, 7}, errs
    assert "nested deeper" in errs[2] and "nested deeper" in errs[7] and "64-bit" in errs[3]
    assert "NaN" in errs[4] and "Infinity" in errs[5] and "Infinity" in errs[6]
    # a NaN in a Parquet row is refused too, never stored as non-standard JSON
    buf = io.BytesIO()
    pq.write_table(pa.table({"prompt": ["a", "b"], "score": [1.0, float("nan")]}), buf)
    r = await live.http.post("/v1/datasets", files={"file": ("d.parquet", buf.getvalue())})
    assert r.status_code == 422 and r.json()["errors"][0]["line"] == 2, r.text
    # run configs and the mapping form field: the same parse
    for body, ctype in (('{"run": "x", "schedule": {"batch_size": ' + "9" * 5000 + "}}", "application/json"),
                        ('{"run": "x", "rollout": {"temperature": NaN}}', "application/json"),
                        ("[" * 200_000, "application/json"),
                        ("run: x\nschedule:\n  batch_size: " + "9" * 5000 + "\n", "application/yaml"),
                        ("run: x\nrollout:\n  temperature: .nan\n", "application/yaml")):
        r = await live.http.post("/v1/runs", content=body, headers={"Content-Type": ctype})
        assert r.status_code in (400, 422), (body[:60], r.text)
    r = await live.http.post("/v1/datasets", files={"file": ("d.jsonl", b'{"prompt": "p"}\n')},
                             data={"mapping": "[" * 50_000})
    assert r.status_code == 422 and "nested" in r.json()["detail"], r.text
    assert (await live.http.get("/v1/runs")).json() == [] and (await live.http.get("/v1/datasets")).json() == []


@SQLITE
async def test_no_docs_page_and_the_spec_needs_the_token(live):
    async with httpx.AsyncClient(base_url=live.url) as anon:
        assert (await anon.get("/openapi.json")).status_code == 401
        for path in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            assert (await anon.get(path)).status_code == 401, path
            assert (await anon.get(path, headers=AUTH)).status_code == 404, path
        spec = await anon.get("/openapi.json", headers=AUTH)
        assert spec.status_code == 200 and "/v1/datasets/hf" in spec.json()["paths"]
        page = await anon.get("/")  # the dashboard stays open and loads nothing from elsewhere
        assert page.status_code == 200 and "cdn" not in page.text.lower() and "https://" not in page.text
