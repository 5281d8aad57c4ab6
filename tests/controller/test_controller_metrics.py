"""GET /metrics on the controller: ledger counts, admission bound, release rate and API latency, in the
Prometheus text format, behind the controller's token like every /v1 read."""

from __future__ import annotations

import pytest
from controller_helpers import AUTH, run_config, wait_for
from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_controller_metrics_report_ledger_bound_rate_and_latency(live, tmp_path):
    import httpx

    assert (await live.http.post("/v1/runs", json=run_config("m1", 1, 4), headers=AUTH)).status_code == 201
    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"prompt": "p{i}", "reference": "{i}"}}\n' for i in range(30)))
    with open(data, "rb") as f:
        d = (await live.http.post("/v1/datasets", files={"file": ("d.jsonl", f)}, headers=AUTH)).json()
    r = await live.http.post("/v1/runs/m1/enqueues", json={"dataset": str(d["id"])}, headers=AUTH)
    assert r.status_code == 201
    run = {}

    async def released():
        run.update((await live.http.get("/v1/runs/m1")).json())
        return run["ledger"]["released"] > 0 and run["ledger"]["released"] == run["admission_bound"]

    await wait_for(released, what="the controller released up to its admission bound")

    async with httpx.AsyncClient(base_url=live.url) as anon:
        assert (await anon.get("/metrics")).status_code == 401  # the token, like /v1 reads
    resp = await live.http.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    got = samples(resp.text)
    n = run["ledger"]["released"]
    assert got[("jetrl_controller_ledger_groups", (("run", "m1"), ("state", "released")))] == n
    assert got[("jetrl_controller_ledger_groups", (("run", "m1"), ("state", "trained")))] == 0
    assert got[("jetrl_controller_released_groups_total", (("run", "m1"),))] == n
    assert got[("jetrl_controller_admission_bound", (("run", "m1"),))] == run["admission_bound"]
    assert got[("jetrl_controller_release_rate", (("run", "m1"),))] == pytest.approx(n / 60.0)
    assert got[("jetrl_controller_current_version", (("run", "m1"),))] == run["current_version"]
    key = ("jetrl_controller_api_request_seconds_count", (("method", "GET"), ("route", "/v1/runs/{run}"),
                                                            ("status", "200")))
    assert got[key] >= 1  # the polls above, under the route template
    # refused before routing (no token): counted, under "unmatched" (no unbounded path labels)
    assert got[("jetrl_controller_api_request_seconds_count", (("method", "GET"), ("route", "unmatched"),
                                                               ("status", "401")))] == 1
