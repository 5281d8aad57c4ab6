""""Where did the time go": the table `jetrl up` and `jetrl demo` print at the end, from the controller's
GET /v1/runs/{run}/timings (controller/timings.py). Trainer stages are shares of the summed step wall
time; the rollout side (per sample, overlapping the trainer) and weight loads (per version and worker)
are means."""

from __future__ import annotations

from rich.table import Table

from shared.contract.messages import ROLLOUT_STAGES, TRAINER_STAGES, WEIGHT_STAGES


def time_rows(timings: dict) -> list[tuple[str, str, float, float | None]]:
    """(side, stage, seconds, share of the trainer's wall time or None), trainer stages biggest first."""
    tot = timings.get("totals") or {}
    wall = float(tot.get("wall_s") or 0.0)
    trainer = tot.get("trainer") or {}
    rows = [("trainer", k, float(trainer.get(k) or 0.0), (float(trainer.get(k) or 0.0) / wall) if wall > 0 else None)
            for k in TRAINER_STAGES]
    rows.sort(key=lambda r: -r[2])
    for side, names in (("rollout (mean per sample)", ROLLOUT_STAGES), ("weights (mean per load)", WEIGHT_STAGES)):
        vals = tot.get(side.split()[0]) or {}
        rows += [(side, k, float(vals[k]), None) for k in names if vals.get(k) is not None]
    return rows


def time_table(timings: dict) -> Table:
    tot = timings.get("totals") or {}
    t = Table(title=f"where did the time go ({tot.get('steps', 0)} steps, {float(tot.get('wall_s') or 0):.1f} s "
                    "of trainer wall time)")
    for col in ("side", "stage", "seconds", "share"):
        t.add_column(col, justify="right" if col in ("seconds", "share") else "left")
    for side, stage, secs, share in time_rows(timings):
        t.add_row(side, stage, f"{secs:.3f}", "" if share is None else f"{100 * share:.1f} %")
    return t
