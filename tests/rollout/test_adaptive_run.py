"""Adaptive sampling through a real `jetrl up` (tiny model, local engine, the FSDP trainer): prompts
whose success probability is set (tests/rollout/coin_workflow.py) -- never, always, rare, even. Groups
reach the trainer only with a reward spread; the prompts that never or always succeed spend the whole
budget and are filtered with the reason in the ledger; the draw counts follow the round rule; staleness
stays within the bound; nothing trains twice; the ledger balances."""

import json
from pathlib import Path

import pytest

from launcher.plan import UpOptions
from launcher.up import Launcher, poll_until
from shared.config import JetrlConfig, load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HERE = Path(__file__).resolve().parent
GROUP, BUDGET, STEPS, BATCH, STALENESS = 4, 16, 4, 2, 1
PROMPTS = {"never": 0.0, "always": 1.0, "rare": 0.1, "even": 0.5}


def coin_rows(per_kind: int) -> list[dict]:
    return [{"prompt": f"{kind} {i}", "reference": str(p), "kind": kind}
            for i in range(per_kind) for kind, p in PROMPTS.items()]


async def run_coins(tmp_path, monkeypatch, rows: list[dict], cfg_yaml: str, steps: int, read, timeout_s: float = 480):
    """`jetrl up` with the coin workflow on `rows` until `steps` steps and nothing in flight; then
    `await read(launcher.http)` (before the services stop), returned."""
    monkeypatch.setenv("PYTHONPATH", f"{HERE}:{monkeypatch.delenv('PYTHONPATH', raising=False) or ''}")
    monkeypatch.syspath_prepend(str(HERE))
    data = tmp_path / "coins.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(cfg_yaml)
    launcher = Launcher(load_config(JetrlConfig, str(cfg_file), []), UpOptions(run_dir=tmp_path / "run", echo_logs=False))
    try:
        await launcher.start(timeout_s=180)
        await launcher.enqueue(data, shuffle_seed=0)

        async def finished():
            snap = await launcher.poll()
            lg = (snap.get("run") or {}).get("ledger") or {}
            return lg.get("in_flight") == 0 and len(launcher.steps) >= steps and lg.get("trained") and snap

        await poll_until(finished, timeout_s, f"{steps} steps and nothing in flight")
        return await read(launcher.http)
    finally:
        await launcher.stop()


async def test_adaptive_sampling_trains_only_groups_with_signal_and_accounts_for_every_draw(tmp_path, monkeypatch):
    rows = coin_rows(6)  # 24 prompts: 6 of each kind
    cfg_yaml = (
        "run: adaptive\nnats: {embedded: true}\ntelemetry: {events_interval_s: 1.0}\nreward: {task: maxdigit}\n"
        f"schedule: {{total_steps: {STEPS}, batch_size: {BATCH}, max_staleness: {STALENESS}}}\n"
        f"rollout: {{workflow: 'coin_workflow:CoinWorkflow', group_size: {GROUP}, max_in_flight: 4,\n"
        f"  sampling: {{max_new_tokens: 2, seed: 7}}, adaptive: {{max_samples: {BUDGET}, stop: spread}}}}\n"
        "launch: {shuffle_seed: 0}\n")

    async def read(http):
        async def events(kind: str) -> list[dict]:
            return (await http.get("/v1/runs/adaptive/events", params={"kind": kind, "limit": 1000})).json()

        groups = await events("groups")
        decided = {g for e in groups for k in ("trained", "filtered") for g in e["data"][k]}

        async def all_published():  # a worker's "published" event may come after the trainer decided its groups
            pub = await events("published")
            return decided <= {r["group_id"] for e in pub for r in e["data"]["prompts"]} and pub

        published = await poll_until(all_published, 60, "every decided group's published record")
        return (groups, published, await events("step"), (await http.get("/v1/runs/adaptive/prompts/stats")).json(),
                (await http.get("/v1/runs/adaptive/ledger")).json())

    groups, published, steps, stats, ledger = await run_coins(tmp_path, monkeypatch, rows, cfg_yaml, STEPS, read)

    prompts = {r["group_id"]: r for e in published for r in e["data"]["prompts"]}
    kind = {gid: gid.split(":")[-1] for gid in prompts}  # prompt ids: <dataset hash>-<row>
    row_kind = {f"{i}": r["kind"] for i, r in enumerate(rows)}
    kind = {gid: row_kind[pid.rsplit("-", 1)[1]] for gid, pid in kind.items()}
    trained = [g for e in groups for g in e["data"]["trained"]]
    filtered = {g: e["data"]["filtered_reasons"].get(g) for e in groups for g in e["data"]["filtered"]}
    assert len(trained) == len(set(trained)) == STEPS * BATCH  # nothing trains twice
    for gid in trained:  # only groups with a spread reach training
        assert prompts[gid]["signal"] and kind[gid] in ("rare", "even"), (gid, prompts[gid])
    for gid, why in filtered.items():  # never, always, and a rare one that missed 16 times (0.9^16 = 19 %)
        assert why == f"no signal after {BUDGET} samples" and not prompts[gid]["signal"]
        assert prompts[gid]["drawn"] == BUDGET and kind[gid] != "even"
    for gid, rec in prompts.items():
        if kind[gid] in ("never", "always"):  # the whole budget, in rounds of the group size
            assert rec["drawn"] == BUDGET and not rec["signal"] and gid not in trained
            assert rec["successes"] == (BUDGET if kind[gid] == "always" else 0)
        elif rec["signal"]:  # stopped at the first round with a spread
            assert GROUP <= rec["drawn"] <= BUDGET and rec["drawn"] % GROUP == 0 and 0 < rec["successes"] < rec["drawn"]
    assert any(rec["drawn"] > GROUP for gid, rec in prompts.items() if kind[gid] == "rare")
    for e in steps:
        d = e["data"]
        assert d["groups_with_signal"] == d["groups"] == BATCH
        assert d["samples_trained"] == BATCH * GROUP and d["samples_drawn"] >= d["samples_trained"]
        assert all(int(k) <= STALENESS for k in d["staleness_hist"])
    # the controller's prompt memory saw every published group once, with every draw
    assert stats["groups_observed"] == len(prompts) and stats["samples_drawn"] == sum(r["drawn"] for r in prompts.values())
    assert stats["groups_with_signal"] == sum(r["signal"] for r in prompts.values())
    assert stats["histogram"]["zero"] == sum(r["successes"] == 0 for r in prompts.values()) > 0
    assert stats["histogram"]["one"] == sum(r["successes"] == r["drawn"] for r in prompts.values()) > 0
    assert ledger["balanced"] and ledger["in_flight"] == 0
    assert ledger["trained"] == STEPS * BATCH and ledger["filtered"] == len(filtered) > 0


async def test_yield_stops_and_short_batches_keep_the_run_exact(tmp_path, monkeypatch):
    """stop: yield (the default) with schedule.batch_wait_s: groups paced 0.4 s apart, a batch of 2 waits at
    most 0.2 s, so early steps train a single group. The last (max_staleness + 1) steps wait for full
    batches (the controller's total cap binds there), and the run ends at total_steps with nothing in
    flight: the groups trained are the steps' groups, the last version announces the groups they trained
    short of a batch; draws stay within the budget, in rounds; staleness holds."""
    steps_total, batch, staleness = 5, 2, 1
    cfg_yaml = (
        "run: adaptive-short\nnats: {embedded: true}\ntelemetry: {events_interval_s: 1.0}\nreward: {task: maxdigit}\n"
        f"schedule: {{total_steps: {steps_total}, batch_size: {batch}, max_staleness: {staleness}, batch_wait_s: 0.2}}\n"
        f"rollout: {{workflow: 'coin_workflow:CoinWorkflow', workflow_args: {{delay_s: 0.4}}, group_size: {GROUP},\n"
        f"  max_in_flight: 2, sampling: {{max_new_tokens: 2, seed: 7}}, adaptive: {{max_samples: {BUDGET}}}}}\n"
        "launch: {shuffle_seed: 0}\n")  # adaptive.stop left at its default, yield

    async def read(http):
        async def get(path: str, **params):
            return (await http.get(f"/v1/runs/adaptive-short/{path}", params=params)).json()

        return (await get("events", kind="step", limit=1000), await get("versions"), await get("ledger"),
                await get("events", kind="published", limit=1000))

    steps, versions, ledger, published = await run_coins(tmp_path, monkeypatch, coin_rows(12), cfg_yaml,
                                                         steps_total, read, timeout_s=300)

    groups = [e["data"]["groups"] for e in sorted(steps, key=lambda e: e["data"]["step"])]
    assert len(groups) == steps_total
    assert min(groups[:-2]) < batch and groups[-2:] == [batch, batch], groups  # cut short early, full at the end
    short = sum(batch - g for g in groups)
    assert max(versions, key=lambda v: v["version"])["short"] == short
    assert ledger["balanced"] and ledger["in_flight"] == 0
    assert ledger["trained"] == sum(groups) == steps_total * batch - short
    for e in steps:
        d = e["data"]
        assert d["groups_with_signal"] == d["groups"] and all(int(k) <= staleness for k in d["staleness_hist"])
    for rec in (r for e in published for r in e["data"]["prompts"]):
        assert GROUP <= rec["drawn"] <= BUDGET and rec["drawn"] % GROUP == 0
