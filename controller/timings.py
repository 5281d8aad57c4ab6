"""Per-version stage timings (GET /v1/runs/{run}/timings): the trainer's "step" events (`timings`,
`rollout_timings`, `wall_s`; trainer_service/timings.py names the stages) joined with the rollout
workers' "weights" events (fetch and swap seconds, averaged over the workers that loaded a version)."""

from __future__ import annotations

from collections import defaultdict

from shared.contract.messages import ROLLOUT_STAGES, TRAINER_STAGES, WEIGHT_STAGES


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def stage_table(steps: list[dict], weights: list[dict]) -> dict:
    """`steps`: step event data, oldest first; `weights`: weights event data. One column per version
    (the last step event of a version wins), and totals: trainer seconds summed, the others averaged."""
    by_version: dict[int, dict] = {}
    for d in steps:
        v = d.get("version")
        if isinstance(v, int) and isinstance(d.get("timings"), dict):
            by_version[v] = d
    loads: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for d in weights:
        v = d.get("version")
        if isinstance(v, int):
            for k in WEIGHT_STAGES:
                x = _num(d.get(f"{k}_s"))
                if x is not None:
                    loads[v][k].append(x)
    versions = sorted(by_version)
    out = {"versions": versions, "steps": [by_version[v].get("step") for v in versions],
           "wall_s": [_num(by_version[v].get("wall_s")) for v in versions],
           "trainer": {k: [_num(by_version[v]["timings"].get(k)) or 0.0 for v in versions] for k in TRAINER_STAGES},
           "rollout": {k: [_num((by_version[v].get("rollout_timings") or {}).get(k)) for v in versions]
                       for k in ROLLOUT_STAGES},
           "weights": {k: [(sum(loads[v][k]) / len(loads[v][k])) if loads[v][k] else None for v in versions]
                       for k in WEIGHT_STAGES}}

    def mean(xs):
        xs = [x for x in xs if x is not None]
        return sum(xs) / len(xs) if xs else None

    out["totals"] = {
        "steps": len(versions), "wall_s": sum(x or 0.0 for x in out["wall_s"]),
        "trainer": {k: sum(out["trainer"][k]) for k in TRAINER_STAGES},
        "rollout": {k: mean(out["rollout"][k]) for k in ROLLOUT_STAGES},
        "weights": {k: mean([x for v in loads for x in loads[v][k]]) for k in WEIGHT_STAGES},
    }
    return out
