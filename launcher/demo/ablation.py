"""`jetrl demo --ablation`: the same demo task trained one run after another under the settings people
compare when samples are stale, so that what an off-policy correction buys is visible:

  sync           max_staleness 0 (every sample from the current policy), decoupled PPO
  decoupled      max_staleness 4, decoupled PPO (AReaL)
  iw_reinforce   max_staleness 4, importance-weighted REINFORCE: -A pi_theta / pi_behav, no clip, no cap
  no_correction  max_staleness 4, REINFORCE on stale samples as if they were fresh (-A log pi_theta)

All four keep the task's settings, so for sort each takes trainer.algorithm.ppo_minibatches = 8
optimizer steps per batch: they differ only in staleness and in the objective.

Each run writes its own summary.json and plots under <out>/<variant>/; the ablation writes
<out>/ablation.json (the key figures of every run) and <out>/ablation.png (held-out reward against
wall time and against policy version, one line per run).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from pathlib import Path

from launcher.demo.run import DemoOptions, run_demo

log = logging.getLogger("jetrl.demo")

# `jetrl demo`'s budget unless its options say otherwise. --ablation runs four demos one after another,
# so each gets 3 minutes, ended by the clock (the measured setting, docs/benchmarks.md "sort-6"), not 4 x 15.
DEMO_BUDGET = (DemoOptions.minutes, DemoOptions.steps, DemoOptions.eval_every)  # 15 minutes, 500 steps, every 5
ABLATION_BUDGET = (3.0, 3000, 10)


def demo_budget(ablation: bool, minutes: float | None, steps: int | None,
                eval_every: int | None) -> tuple[float, int, int]:
    """(minutes, steps, eval_every): what was given, else the demo's or the ablation's default."""
    given = (minutes, steps, eval_every)
    default = ABLATION_BUDGET if ablation else DEMO_BUDGET
    return tuple(g if g is not None else d for g, d in zip(given, default, strict=True))  # type: ignore[return-value]


@dataclass(frozen=True)
class Variant:
    name: str
    max_staleness: int
    overrides: tuple[str, ...]
    label: str


def demo_minibatches(task: str) -> int:
    """trainer.algorithm.ppo_minibatches of the demo's settings for `task` (1 when unset)."""
    from launcher.demo.run import demo_settings

    return int(demo_settings(task=task)["trainer"]["algorithm"].get("ppo_minibatches", 1))


def variants(task: str = "sort") -> list[Variant]:
    """The runs of the ablation, in order. All keep the task's settings (for sort: 8 PPO minibatches, so
    every run takes the same optimizer steps); they differ in staleness and objective only."""
    k = demo_minibatches(task)
    steps = f", {k} minibatches" if k > 1 else ""
    return [
        Variant("sync", 0, (), f"max_staleness 0, decoupled PPO{steps}"),
        Variant("decoupled", 4, (), f"max_staleness 4, decoupled PPO{steps}"),
        Variant("iw_reinforce", 4, ("trainer.algorithm.objective=iw_reinforce", "trainer.algorithm.decoupled=false"),
                f"max_staleness 4, IW-REINFORCE{steps}"),
        Variant("no_correction", 4, ("trainer.algorithm.objective=reinforce",),
                f"max_staleness 4, no correction{steps}"),
    ]


def key_figures(name: str, label: str, s: dict | None) -> dict:
    if s is None:
        return {"variant": name, "label": label, "failed": True}
    return {
        "variant": name, "label": label, "max_staleness": s["max_staleness"], "overrides": s.get("overrides", []),
        "initial_heldout_reward": s["initial_heldout_reward"], "final_heldout_reward": s["final_heldout_reward"],
        "versions": s["versions"], "train_seconds": s["train_seconds"],
        "first_version_at_target": s["first_version_at_target"],
        "first_seconds_at_target": s.get("first_seconds_at_target"),
        "heldout_curve": s["heldout_curve"], "heldout_vs_seconds": s.get("heldout_vs_seconds", []),
        "staleness_hist": s["staleness_hist"],
    }


async def ablation_main(opts: DemoOptions, replay: bool = False) -> int:
    """The four runs; with `replay`, then the corrections replayed from the `decoupled` run's recording
    (replay_ablation.py), drawn dashed on the version panel."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    out = opts.out.resolve()
    runs = variants(opts.task)
    results, code = [], 0
    for v in runs:
        console.print(f"[bold]ablation[/] {v.name}: {v.label}")
        o = replace(opts, out=out / v.name, max_staleness=v.max_staleness, panel=False,
                    overrides=[*opts.overrides, *v.overrides])
        rc, summary = await run_demo(o, console)
        code = code or rc
        results.append(key_figures(v.name, v.label, summary))
        (out / "ablation.json").write_text(json.dumps({"task": opts.task, "runs": results}, indent=1))
    replayed = []
    if replay:
        from launcher.demo.replay_ablation import recorded_run, replay_corrections

        try:
            replayed = await replay_corrections(recorded_run(out / "decoupled"), out / "replay", console,
                                                save_every=opts.eval_every)
        except Exception as exc:  # the live runs' results stand; say why the replay did not
            console.print(f"[red]replay failed:[/] {type(exc).__name__}: {exc}")
            code = code or 1
    plot_ablation(results, out / "ablation.png", opts.task, replayed)
    t = Table(title=f"jetrl demo --ablation ({opts.task})")
    for col in ("run", "held-out start -> end", "versions", "seconds", "first version >= 0.9", "seconds to 0.9"):
        t.add_column(col)
    for r in results:
        if r.get("failed"):
            t.add_row(r["variant"], "failed", "-", "-", "-", "-")
            continue
        t.add_row(r["variant"], f"{_f(r['initial_heldout_reward'])} -> {_f(r['final_heldout_reward'])}",
                  str(r["versions"]), str(r["train_seconds"]), str(r["first_version_at_target"] or "-"),
                  str(r["first_seconds_at_target"] or "-"))
    console.print(t)
    if replayed:
        rt = Table(title="corrections replayed from the decoupled run's recording (same samples)")
        for col in ("correction", "final held-out", "first version >= 0.9", "replay seconds"):
            rt.add_column(col)
        for r in replayed:
            first = next((v for v, x in r["heldout_curve"] if x >= 0.9), None)
            rt.add_row(r["variant"], _f(r["final"]), str(first or "-"), str(r["replay_seconds"]))
        console.print(rt)
    console.print(f"ablation: {out / 'ablation.json'}, {out / 'ablation.png'}")
    return code


def _f(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def plot_ablation(results: list[dict], path: Path, task: str, replayed: list[dict] | None = None) -> Path | None:
    """Held-out reward against wall time (left) and against version (right), one line per run; replayed
    corrections (no wall time of their own) dashed on the right."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'jetrl[plots]'): no ablation plot")
        return None
    fig, (a_t, a_v) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for r in results:
        if r.get("failed"):
            continue
        ts = r["heldout_vs_seconds"]
        a_t.plot([t for t, _, _ in ts], [x for _, _, x in ts], marker=".", label=r["label"])
        a_v.plot([v for v, _ in r["heldout_curve"]], [x for _, x in r["heldout_curve"]], marker=".", label=r["label"])
    for r in replayed or []:
        a_v.plot([v for v, _ in r["heldout_curve"]], [x for _, x in r["heldout_curve"]], linestyle="--",
                 marker="x", markersize=3, label=r["label"])
    for ax, xl in ((a_t, "seconds of training"), (a_v, "policy version")):
        ax.axhline(0.9, color="grey", linestyle="--", linewidth=0.8)
        ax.set(xlabel=xl, ylim=(0, 1.02))
    a_t.set_ylabel("held-out reward (greedy)")
    a_v.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"{task}: staleness and off-policy corrections")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
