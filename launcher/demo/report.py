"""The demo's outputs: summary.json, a rich table, and PNG plots (held-out reward vs version,
staleness histogram, throughput). Plots need matplotlib (`pip install jetrl[plots]`); without it the
summary is still written."""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path

from rich.table import Table

log = logging.getLogger("jetrl.demo")

TARGET = 0.9  # the learning bar: held-out reward from chance to >= 0.9


def staleness_hist(steps: list[dict]) -> dict[str, int]:
    """Summed staleness histogram of trained samples over every trainer step."""
    hist: dict[int, int] = defaultdict(int)
    for s in steps:
        for k, v in (s.get("staleness_hist") or {}).items():
            hist[int(k)] += int(v)
    return {str(k): hist[k] for k in sorted(hist)}


def heldout_curve(evals: list[dict]) -> list[list[float]]:
    """[[version, held-out reward], ...] by version (the latest result of a version wins)."""
    by_version = {}
    for e in sorted(evals, key=lambda e: e.get("time", 0)):
        by_version[int(e["version"])] = float(e["reward"])
    return [[v, by_version[v]] for v in sorted(by_version)]


def throughput(steps: list[dict]) -> list[list[float]]:
    """[[seconds since the first step, trained samples/s over the step], ...]."""
    out = []
    for prev, cur in zip(steps, steps[1:], strict=False):
        dt = cur["time"] - prev["time"]
        if dt > 0:
            out.append([cur["time"] - steps[0]["time"], float(cur.get("samples", 0)) / dt])
    return out


def version_times(steps: list[dict], start: float) -> dict[int, float]:
    """{version: seconds after `start` when the trainer published it}; version 0 at 0."""
    out = {0: 0.0}
    for s in steps:
        if s.get("version") is not None and s.get("time") is not None:
            out[int(s["version"])] = round(float(s["time"]) - start, 2)
    return out


def heldout_vs_time(curve: list[list[float]], times: dict[int, float]) -> list[list[float]]:
    """[[seconds when the version existed, version, held-out reward], ...] for the versions with a time."""
    return [[times[int(v)], v, r] for v, r in curve if int(v) in times]


def summarise_run(opts, launcher, ledger: dict, train_s: float, final_version: int,
                  start_time: float | None = None) -> dict:
    steps, curve = launcher.steps, heldout_curve(launcher.evals)
    times = version_times(steps, steps[0]["time"] if start_time is None and steps else (start_time or 0.0))
    by_v = dict((int(v), r) for v, r in curve)
    accounted = (ledger.get("trained", 0) + ledger.get("dropped_stale", 0) + ledger.get("filtered", 0)
                 + ledger.get("dead_lettered", 0) + ledger.get("in_flight", 0))
    samples = sum(int(s.get("samples", 0)) for s in steps)
    final = by_v.get(final_version)
    first_at_target = next((v for v, r in curve if r >= TARGET), None)
    return {
        "run": launcher.run,
        "task": getattr(opts, "task", "maxdigit"),
        "engine": opts.engine,
        "workers": opts.workers,
        "max_staleness": opts.max_staleness,
        "initial_heldout_reward": by_v.get(0),
        "final_heldout_reward": final,
        "reached_target": final is not None and final >= TARGET,
        "target": TARGET,
        "first_version_at_target": first_at_target,
        "versions": final_version,
        "trainer_steps": len(steps),
        "samples_trained": samples,
        "dropped_stale": int(ledger.get("dropped_stale", 0)),
        "dropped_stale_samples": sum(int(s.get("dropped_stale_samples", 0)) for s in steps),
        "released_prompts": int(ledger.get("released", 0)),
        "trained_prompts": int(ledger.get("trained", 0)),
        "in_flight_prompts": int(ledger.get("in_flight", 0)),
        "dead_lettered_prompts": int(ledger.get("dead_lettered", 0)),
        "unaccounted_prompts": int(ledger.get("released", 0)) - accounted,
        "train_seconds": round(train_s, 1),
        "samples_per_s": round(samples / train_s, 2) if train_s > 0 else 0.0,
        "heldout_curve": curve,
        "heldout_vs_seconds": heldout_vs_time(curve, times),
        "first_seconds_at_target": next((t for t, _, r in heldout_vs_time(curve, times) if r >= TARGET), None),
        "overrides": list(getattr(opts, "overrides", [])),
        "staleness_hist": staleness_hist(steps),
        "run_dir": str(launcher.opts.run_dir),
    }


def summary_table(summary: dict) -> Table:
    t = Table(title=f"jetrl demo: {summary['run']}", show_header=False, box=None, padding=(0, 2))
    rows = [
        ("held-out reward", f"{_f(summary['initial_heldout_reward'])} -> {_f(summary['final_heldout_reward'])}"
                            f" ({'reached' if summary['reached_target'] else 'below'} {summary['target']})"),
        ("policy versions", str(summary["versions"])),
        ("samples trained", str(summary["samples_trained"])),
        ("dropped as stale", f"{summary['dropped_stale']} groups ({summary['dropped_stale_samples']} samples), "
                             f"max_staleness {summary['max_staleness']}"),
        ("staleness", ", ".join(f"{k}: {v}" for k, v in summary["staleness_hist"].items()) or "-"),
        ("throughput", f"{summary['samples_per_s']} samples/s over {summary['train_seconds']} s"),
        ("prompts", f"released {summary['released_prompts']}, trained {summary['trained_prompts']}, in flight "
                    f"{summary['in_flight_prompts']}, unaccounted {summary['unaccounted_prompts']}"),
    ]
    for k, v in rows:
        t.add_row(f"[bold]{k}[/]", v)
    return t


def _f(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def write_outputs(out: Path, summary: dict, steps: list[dict], evals: list[dict]) -> list[Path]:
    """summary.json (always) and the PNG plots (when matplotlib is installed); returns the plot paths."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'jetrl[plots]'): no plots written")
        return []
    paths = []
    curve = summary["heldout_curve"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([v for v, _ in curve], [r for _, r in curve], marker="o", label="held-out (greedy)")
    train = [(s.get("version", i + 1), s.get("reward_mean")) for i, s in enumerate(steps) if s.get("reward_mean") is not None]
    if train:
        ax.plot([v for v, _ in train], [r for _, r in train], alpha=0.4, label="training batch (sampled)")
    ax.axhline(summary["target"], color="grey", linestyle="--", linewidth=0.8)
    ax.set(xlabel="policy version", ylabel="reward", ylim=(0, 1.02),
           title=f"{summary.get('task', 'maxdigit')}, max_staleness {summary['max_staleness']}")
    ax.legend(loc="lower right")
    paths.append(_save(fig, out / "heldout_reward.png"))
    hist = summary["staleness_hist"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar([int(k) for k in hist], list(hist.values()))
    ax.set(xlabel="staleness (versions)", ylabel="trained samples", title="staleness of trained samples")
    paths.append(_save(fig, out / "staleness_hist.png"))
    tp = throughput(steps)
    fig, ax = plt.subplots(figsize=(6, 4))
    if tp:
        ax.plot([t for t, _ in tp], [x for _, x in tp], alpha=0.5, label="per step")
    ax.axhline(summary["samples_per_s"], color="grey", linestyle="--", linewidth=0.8, label="mean")
    ax.set(xlabel="seconds", ylabel="trained samples / s", title="trainer throughput")
    ax.legend(loc="lower right")
    paths.append(_save(fig, out / "throughput.png"))
    return paths


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
