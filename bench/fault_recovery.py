"""Fault recovery of a running demo-sized run (the fault suite's scenario, testkit/fault_scenario.py): each
service SIGKILLed once, then poison messages.

    python -m bench.fault_recovery [--dir DIR] [--keep] [--steps-per-slice 10]

The scenario is testkit/fault_scenario.py, the same one tests/fault/ asserts on: a real `jetrl up`
run (embedded nats-server, SQLite, local engine, tiny policy on maxdigit) in which a rollout worker, the
reward service, the trainer, the weight store, the controller and the nats-server are SIGKILLed one at a
time while work flows (the supervisor restarts each), then undecodable and wrong-schema messages are
published on PROMPTS, TRAJECTORIES and EVENTS. Prints one row per fault:
- back: seconds from the SIGKILL until the restarted service answers (its first health event, its HTTP
  endpoint, its port);
- recovered: seconds from the SIGKILL until the run made progress through it (see the progress column);
- lost: groups in flight at the kill (ledger released/received) never trained, dropped or dead-lettered;
- duplicated: groups trained twice in the final model's lineage, the second time after this kill;
- other restarts: other services that crashed (and were restarted) meanwhile;
then one row per poison message (the consumer that dead-lettered it and its reason), and the audit of
the finished run (ledger, versions, lineage).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path

from testkit.fault_scenario import FAULTS, Audit, FaultScenario


def fault_table(sc: FaultScenario) -> list[str]:
    rows = ["| fault (SIGKILL) | back after | recovered after | progress seen | in flight at kill | lost | "
            "duplicated | other restarts | note |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for o in sc.outcomes:
        others = ", ".join(f"{k} x{n}" for k, n in o.collateral.items()) or "none"
        rows.append(f"| {o.fault} | {o.back_s:.1f} s | {o.progress_s:.1f} s | {o.progress} | "
                    f"{len(o.in_flight_at_kill)} | {o.lost} | {o.duplicated} | {others} | {o.note} |")
    return rows


def poison_table(sc: FaultScenario) -> list[str]:
    rows = ["| poison on | message | dead-lettered by | after | reason |", "| --- | --- | --- | --- | --- |"]
    for p in sc.poisons:
        after = "-" if p.dead_lettered_s is None else f"{p.dead_lettered_s:.1f} s"
        rows.append(f"| {p.stream} (`{p.subject}`) | {p.kind} | `{p.source}` | {after} | `{p.reason}` |")
    return rows


def audit_lines(sc: FaultScenario, a: Audit) -> list[str]:
    lg = a.ledger
    unaccounted = lg["released"] - lg["trained"] - lg["dropped_stale"] - lg["filtered"] - lg["dead_lettered"]
    return [
        f"run: {sc.total_steps} steps x {sc.batch_size} groups x {sc.group_size} samples; trainer exit "
        f"{a.trainer_exit}",
        f"ledger: released {lg['released']} = trained {lg['trained']} + dropped_stale {lg['dropped_stale']} + "
        f"filtered {lg['filtered']} + dead_lettered {lg['dead_lettered']} + in flight {lg['in_flight']} "
        f"(unaccounted {unaccounted}); {a.ledger_rows} rows, {a.distinct_groups} distinct group ids",
        f"versions: {len(a.versions)} recorded, strictly increasing: {a.versions_increasing} "
        f"(first {a.versions[:1]}, last {a.versions[-1:]})",
        f"lineage: {len(a.lineage_steps)} steps (1..{max(a.lineage_steps, default=0)}), {a.lineage_groups} groups, "
        f"trained twice: {len(a.duplicates)}; group trainings discarded by resumes: {a.retrained}",
    ]


async def main(args) -> int:
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="jetrl-bench-faults-"))
    sc = FaultScenario(root, steps_per_slice=args.steps_per_slice)
    t0 = time.monotonic()
    try:
        await sc.start()
        print(f"[{time.monotonic() - t0:5.0f}s] run up in {root}", flush=True)
        for fault in FAULTS:
            o = await sc.inject(fault)
            print(f"[{time.monotonic() - t0:5.0f}s] {fault}: back {o.back_s:.1f}s, recovered {o.progress_s:.1f}s",
                  flush=True)
        await sc.poison()
        print(f"[{time.monotonic() - t0:5.0f}s] poison messages dead-lettered", flush=True)
        audit = await sc.finish()
        print(f"[{time.monotonic() - t0:5.0f}s] run finished", flush=True)
    finally:
        await sc.stop()
        if not args.keep and not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print(f"`python -m bench.fault_recovery`, {time.strftime('%Y-%m-%d')}, {time.monotonic() - t0:.0f} s")
    print()
    print("\n".join(fault_table(sc)))
    print()
    print("\n".join(poison_table(sc)))
    print()
    print("\n".join(audit_lines(sc, audit)))
    bad = (audit.ledger["in_flight"] or audit.duplicates or not audit.versions_increasing
           or any(o.lost or o.collateral for o in sc.outcomes))
    return 1 if bad else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="Run dir (kept); default a temp dir, removed unless --keep.")
    ap.add_argument("--keep", action="store_true", help="Keep the temp run dir (logs, database, checkpoints).")
    ap.add_argument("--steps-per-slice", type=int, default=10, help="Trainer steps of prompts per phase.")
    sys.exit(asyncio.run(main(ap.parse_args())))
