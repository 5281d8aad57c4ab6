"""The REST API against a live controller, real nats-server, SQLite and PostgreSQL."""

from __future__ import annotations

import json

import httpx
import yaml
from ci_gate import need_module
from controller_helpers import (
    AUTH,
    maxdigit_rows,
    prompts_count,
    run_config,
    stream_prompts,
    wait_for,
    write_jsonl,
)

from shared.contract import subjects


async def upload(live, path, mapping=None, name=""):
    data = {"mapping": json.dumps(mapping)} if mapping else {}
    if name:
        data["name"] = name
    with open(path, "rb") as f:
        return await live.http.post("/v1/datasets", files={"file": (path.name, f)}, data=data, headers=AUTH)


async def test_upload_enqueue_releases_prompts_with_group_ids(live, js, tmp_path):
    rows = maxdigit_rows(10)
    p = tmp_path / "maxdigit.jsonl"
    write_jsonl(p, rows)
    r = await upload(live, p)
    assert r.status_code == 201, r.text
    d = r.json()
    assert d["num_rows"] == 10 and d["created"] is True
    r = await live.http.post("/v1/runs", json=run_config("t1", max_staleness=10, batch_size=10), headers=AUTH)
    assert r.status_code == 201, r.text
    r = await live.http.post("/v1/runs/t1/enqueues", json={"dataset": str(d["id"]), "epochs": 2}, headers=AUTH)
    assert r.status_code == 201, r.text
    assert r.json()["total"] == 20

    await wait_for(lambda: prompts_count(js, "t1"), what="prompts released")
    await wait_for(lambda: _eq(prompts_count(js, "t1"), 20), what="all 20 prompts released")
    msgs = await stream_prompts(js, "t1")
    ids = [mid for mid, _ in msgs]
    assert len(set(ids)) == 20
    for mid, task in msgs:
        assert mid == subjects.group_id("t1", task.epoch, task.prompt_id) == task.group_id
        assert task.group_size == 2 and task.workflow == "single_turn" and task.released_at_version == 0
    by_row = {(t.epoch, t.prompt_id): t for _, t in msgs}
    first = by_row[(0, f"{d['content_hash'][:12]}-0")]
    assert first.payload == {"prompt": rows[0]["question"], "reference": rows[0]["answer"], "metadata": {"idx": 0}}
    assert {t.epoch for _, t in msgs} == {0, 1}

    lg = (await live.http.get("/v1/runs/t1/ledger")).json()
    assert lg["released"] == 20 and lg["in_flight"] == 20 and lg["balanced"]


async def _eq(coro, want):
    return (await coro) == want


async def test_same_file_twice_is_one_dataset_and_reenqueue_is_idempotent(live, js, tmp_path):
    p = tmp_path / "d.jsonl"
    write_jsonl(p, maxdigit_rows(6))
    a = (await upload(live, p)).json()
    r2 = await upload(live, p, name="again")
    assert r2.status_code == 200 and r2.json()["id"] == a["id"] and r2.json()["created"] is False
    assert (await live.http.post("/v1/runs", json=run_config("t2", 10, 10), headers=AUTH)).status_code == 201
    # the same config again is the same run; a different one is a conflict
    again = await live.http.post("/v1/runs", json=run_config("t2", 10, 10), headers=AUTH)
    assert again.status_code == 200
    conflict = await live.http.post("/v1/runs", json=run_config("t2", 3, 10), headers=AUTH)
    assert conflict.status_code == 409 and "different config" in conflict.json()["detail"]

    body = {"dataset": a["content_hash"][:10], "epochs": 1, "shuffle_seed": 7}
    e1 = await live.http.post("/v1/runs/t2/enqueues", json=body, headers=AUTH)
    await wait_for(lambda: _eq(prompts_count(js, "t2"), 6), what="6 prompts")
    e2 = await live.http.post("/v1/runs/t2/enqueues", json=body, headers=AUTH)
    assert e1.status_code == 201 and e2.status_code == 200 and e2.json()["id"] == e1.json()["id"]
    # a restart-like republish of identical ids changes nothing either
    await live.ctl.releasers["t2"]._republish_unconfirmed()
    assert await prompts_count(js, "t2") == 6
    lg = (await live.http.get("/v1/runs/t2/ledger")).json()
    assert lg["released"] == 6
    # a new request (limit) continues with the next epoch: new ids, nothing repeated
    e3 = await live.http.post("/v1/runs/t2/enqueues", json={"dataset": a["name"], "limit": 2}, headers=AUTH)
    assert e3.status_code == 201 and e3.json()["first_epoch"] == 1
    await wait_for(lambda: _eq(prompts_count(js, "t2"), 8), what="8 prompts")
    ids = [mid for mid, _ in await stream_prompts(js, "t2")]
    assert len(ids) == len(set(ids)) == 8


async def test_bad_uploads_get_4xx_naming_the_line(live, tmp_path):
    cases = {
        "broken.jsonl": ('{"prompt": "a", "reference": "1"}\n{"prompt": "b", "refer\n', "line 2:", "not valid JSON"),
        "missing.jsonl": ('{"prompt": "a", "reference": "1"}\n{"prompt": "b", "reference": "1"}\n{"reference": "2"}\n',
                          "line 3:", "missing field 'prompt'"),
        "type.jsonl": ('{"prompt": ["x"], "reference": "1"}\n', "line 1:", "must be a string, got array"),
        "empty.jsonl": ("", "no rows", "no rows"),
    }
    for name, (text, where, what) in cases.items():
        p = tmp_path / name
        p.write_text(text)
        r = await upload(live, p)
        assert r.status_code == 422, (name, r.text)
        body = r.json()
        assert where in body["detail"] and what in body["detail"], (name, body)
    r = (await live.http.get("/v1/datasets")).json()
    assert r == []


async def test_100_mb_upload_with_a_bad_last_line_names_that_line(live, tmp_path):
    p = tmp_path / "big.jsonl"
    line = json.dumps({"prompt": "max 1 2 3 4 5 =" + " " * 1000, "reference": "5"}) + "\n"
    n = 100 * 1024 * 1024 // len(line) + 1
    with open(p, "w") as f:
        f.write(line * n)
        f.write('{"prompt": "max 1 =", "reference": 1\n')
    assert p.stat().st_size > 100 * 1024 * 1024
    r = await upload(live, p)
    assert r.status_code == 422, r.text[:500]
    assert r.json()["detail"].startswith(f"line {n + 1}:")


async def test_upload_over_the_size_limit_is_413(live, tmp_path):
    live.ctl.ccfg.max_upload_mb = 1
    p = tmp_path / "big.jsonl"
    write_jsonl(p, [{"prompt": "x" * 1000, "reference": "1"}] * 1200)
    r = await upload(live, p)
    assert r.status_code == 413 and "controller.max_upload_mb" in r.json()["detail"]


async def test_writes_need_the_bearer_token(live):
    async with httpx.AsyncClient(base_url=live.url) as anon:
        r = await anon.post("/v1/runs", json=run_config("t3"))
        assert r.status_code == 401 and "Bearer" in r.json()["detail"]
        r = await anon.post("/v1/runs", json=run_config("t3"), headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        assert (await anon.get("/v1/runs")).status_code == 401  # reads need the token too
        assert (await anon.get("/v1/runs", headers=AUTH)).status_code == 200


async def test_run_from_yaml_lifecycle_and_config_errors_name_the_field(live):
    text = yaml.safe_dump(run_config("t4", 1, 2))
    r = await live.http.post("/v1/runs", content=text, headers={**AUTH, "Content-Type": "application/yaml"})
    assert r.status_code == 201, r.text
    assert r.json()["admission_bound"] == 4
    bad = await live.http.post("/v1/runs", json={"run": "t5", "schedule": {"batch_size": 0}}, headers=AUTH)
    assert bad.status_code == 422 and "schedule.batch_size" in bad.json()["detail"]
    typo = await live.http.post("/v1/runs", json={"run": "t5", "schedul": {}}, headers=AUTH)
    assert typo.status_code == 422 and "schedul" in typo.json()["detail"]
    broken = await live.http.post("/v1/runs", content="a: [", headers={**AUTH, "Content-Type": "application/yaml"})
    assert broken.status_code == 400 and "YAML" in broken.json()["detail"]
    for action, status in (("pause", "paused"), ("resume", "running"), ("stop", "stopped")):
        r = await live.http.post(f"/v1/runs/t4/{action}", headers=AUTH)
        assert r.status_code == 200 and r.json()["status"] == status
    r = await live.http.post("/v1/runs/t4/resume", headers=AUTH)
    assert r.status_code == 409 and "stopped" in r.json()["detail"]
    assert (await live.http.get("/v1/runs/nope")).status_code == 404
    assert (await live.http.get("/v1/runs/bad%20id")).status_code == 422


async def test_register_by_server_path_and_hf_builder(live, tmp_path):
    need_module("datasets", "jetrl[datasets]")
    rows = [{"q": f"max {i} =", "a": str(i)} for i in range(5)]
    p = write_jsonl(tmp_path / "srv.jsonl", rows)
    mapping = {"prompt": "q", "reference": "a"}
    live.ctl.ccfg.path_roots = [str(tmp_path)]
    r = await live.http.post("/v1/datasets/path", json={"path": p, "mapping": mapping}, headers=AUTH)
    assert r.status_code == 201, r.text
    h = await live.http.post("/v1/datasets/hf", json={"name": "json", "split": "train", "data_files": [p],
                                                      "mapping": mapping}, headers=AUTH)
    assert h.status_code == 200, h.text  # same rows -> the same dataset
    assert h.json()["id"] == r.json()["id"]
    missing = await live.http.post("/v1/datasets/path", json={"path": str(tmp_path / "nope.jsonl")}, headers=AUTH)
    # missing inside the roots: the same 403 as a forbidden path (test_controller_hostile_data.py)
    assert missing.status_code == 403 and "not found, not readable, or not under" in missing.json()["detail"]
