"""SmolLM2-135M-Instruct learning the addition task (examples/smollm2_addition.yaml) for a training-time
budget: speed, memory, and held-out accuracy before and after. The same task and settings as TRL's
GRPOTrainer row in docs/benchmarks.md ("SmolLM2-135M addition"). `--config
examples/calculator_agent_smollm2.yaml` runs the calculator agent the same way (docs/benchmarks.md,
"SmolLM2-135M learns a calculator") and adds the held-out tool-call rate before and after.

    jetrl model import-gguf --out jetrl-models/smollm2-135m      # once
    python bench/smollm2_addition.py [--minutes 15] [--out jetrl-bench/smollm2-addition] [key=value ...]

Starts the whole run (`jetrl up` in-process: NATS, controller, weight store, reward, one rollout worker
with the local engine, the trainer), enqueues the 2,000 training prompts, trains until the budget (counted
from the moment every service is up) or schedule.total_steps, stops the trainer, then evaluates version
0 and the last version greedily on the 200 held-out prompts. Prints completions/s and generated tokens/s
over the training time, seconds per step by stage (trainer: proximal pass, forward, backward, optimizer,
publish, from its step events; rollout: a sample's generate and reward seconds, means over each step's
samples (the step events' `rollout_timings`), and fetch + swap seconds per weight version (the worker's
`weights` events); the stages of an asynchronous run overlap, so they do not add up to the step time),
peak RSS of the trainer and the rollout worker (VmHWM), the trainer's RSS at steps 10, 50, 100 and the
last (step events' `rss_gb`), and the accuracy; writes summary.json and the demo's plots into the run dir.
Last line: `smollm2_completions_per_s: X`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def peak_rss_gb(pid: int | None) -> float:
    """Peak resident set (VmHWM) of a live process and its children, in GB (0 when it is gone)."""
    if pid is None:
        return 0.0
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1]) * 1024
            for t in Path(f"/proc/{p}/task").iterdir():
                with contextlib.suppress(OSError):
                    todo += [int(c) for c in (t / "children").read_text().split()]
    return total / 1e9


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


async def run(args) -> dict:
    from launcher.demo.report import staleness_hist, write_outputs
    from launcher.demo.run import eval_version
    from launcher.plan import UpOptions
    from launcher.up import Launcher
    from shared.config import JetrlConfig, load_config

    run_name = f"{Path(args.config).stem.replace('_', '-')}-{time.strftime('%Y%m%d-%H%M%S')}"
    overrides = [f"run={run_name}", "eval.eval_every=0", *args.overrides]
    cfg = load_config(JetrlConfig, str(args.config), overrides)
    out = Path(args.out).resolve() / run_name
    launcher = Launcher(cfg, UpOptions(run_dir=out, workers=1, echo_logs=False, with_eval=False))
    heldout = Path(cfg.eval.dataset).resolve()
    res: dict = {"run": run_name, "budget_min": args.minutes, "config": str(args.config), "overrides": overrides}
    try:
        await launcher.start()
        t0 = time.monotonic()
        await launcher.enqueue(str(Path(cfg.launch.dataset).resolve()), epochs=cfg.launch.epochs,
                               shuffle_seed=cfg.launch.shuffle_seed)
        deadline = t0 + args.minutes * 60
        rss = {"trainer": 0.0, "rollout": 0.0}
        # Ctrl-C or SIGTERM ends the training budget early; the run is still measured, evaluated and stopped
        early = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, early.set)
        while time.monotonic() < deadline and not early.is_set():
            snap = await launcher.poll()
            for name in rss:
                c = launcher.sup.children.get(name)
                rss[name] = max(rss[name], peak_rss_gb(c.proc.pid if c and c.proc else None))
            if launcher.trainer_done(snap):
                break
            await asyncio.sleep(2.0)
        train_s = time.monotonic() - t0
        res["ended_early"] = early.is_set()
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C interrupts as usual
            asyncio.get_running_loop().remove_signal_handler(sig)
        for name in rss:
            c = launcher.sup.children.get(name)
            rss[name] = max(rss[name], peak_rss_gb(c.proc.pid if c and c.proc else None))
        metrics = [e["data"] for e in await launcher._new_events("metrics") if "generated_tokens" in e["data"]]
        swaps = [e["data"] for e in await launcher._new_events("weights")]
        await launcher.stop_child("trainer")
        await launcher.stop_child("rollout")
        snap = await launcher.poll()
        steps = launcher.steps
        final = int((snap.get("run") or {}).get("current_version", 0))
        last = metrics[-1] if metrics else {}
        n = max(len(steps), 1)
        res.update({
            "train_s": round(train_s, 1), "steps": len(steps), "final_version": final,
            "completions": sum(s["samples"] for s in steps),
            # every sample generated and scored (adaptive sampling's extra rounds included), the groups
            # trained and how many of them had a reward spread
            "samples_drawn": int(last.get("samples_drawn", 0)),
            "groups_trained": sum(s.get("groups", 0) for s in steps),
            "groups_with_signal": sum(s.get("groups_with_signal", 0) for s in steps),
            "generated_tokens": int(last.get("generated_tokens", 0)),
            "s_per_step": round(train_s / n, 2),
            "stage_s": {
                "rollout_generate_per_sample": round(_mean([s["rollout_timings"]["generate"] for s in steps]), 2),
                "rollout_reward_per_sample": round(_mean([s["rollout_timings"]["reward"] for s in steps]), 3),
                # the trainer's stages of each step event (trainer_service/timings.py)
                **{f"trainer_{k}": round(_mean([s.get("timings", {}).get(k, 0.0) for s in steps]), 2)
                   for k in ("forward", "backward", "optimizer", "train_other")},
                "trainer_step_total": round(_mean([s.get("step_time_s", 0.0) for s in steps]), 2),
                "publish": round(_mean([s.get("timings", {}).get("publish", 0.0) for s in steps]), 2),
                "fetch_per_version": round(_mean([w["fetch_s"] for w in swaps]), 2),
                "swap_per_version": round(_mean([w["swap_s"] for w in swaps]), 2),
                "versions_swapped": len(swaps),
            },
            "peak_rss_gb": {k: round(v, 2) for k, v in rss.items()},
            # the trainer's own resident memory at steps 10, 50, 100 and the last (flat = no growth)
            "trainer_rss_gb_at_step": {str(s["step"]): s.get("rss_gb") for s in steps
                                       if s["step"] in (10, 50, 100) or s is steps[-1]},
            "train_reward_first_last": [steps[0]["reward_mean"], steps[-1]["reward_mean"]] if steps else [],
        })
        res["completions_per_s"] = round(res["completions"] / train_s, 3)
        res["generated_tokens_per_s"] = round(res["generated_tokens"] / train_s, 2)
        print("speed (before the held-out evaluations): " + json.dumps(res), flush=True)
        if not args.no_eval:
            acc, mean, tools = {}, {}, {}
            for v in sorted({0, final}):
                r = await eval_version(launcher, heldout, v)
                # accuracy: the share solved (reward >= eval.success_reward); the mean reward differs from it
                # only where the reward gives partial credit (the calculator agent's)
                acc[v], mean[v], tools[v] = r.pass_at_1, r.reward, (r.tool_call_rate, r.tool_calls_per_episode)
            res["heldout_before"], res["heldout_after"] = acc[0], acc[final]
            res["heldout_reward_before"], res["heldout_reward_after"] = mean[0], mean[final]
            if tools[0][0] is not None:  # an agent workflow: held-out episodes with a tool call, tool calls each
                res["tool_call_rate_before"], res["tool_call_rate_after"] = tools[0][0], tools[final][0]
                res["tool_calls_per_episode_before"], res["tool_calls_per_episode_after"] = tools[0][1], tools[final][1]
        # summary.json and the demo's plots (held-out before/after with the training reward per version,
        # staleness of trained samples, throughput) in the run dir
        summary = {**res, "task": Path(args.config).stem, "target": args.target,
                   "max_staleness": cfg.schedule.max_staleness, "staleness_hist": staleness_hist(steps),
                   "samples_per_s": res["completions_per_s"],
                   "heldout_curve": [[0, res["heldout_before"]], [final, res["heldout_after"]]]
                   if "heldout_before" in res else []}
        res["outputs"] = [str(p) for p in write_outputs(out, summary, steps, [])] + [str(out / "summary.json")]
    finally:
        await launcher.stop()
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=str(ROOT / "examples" / "smollm2_addition.yaml"))
    p.add_argument("--minutes", type=float, default=15.0, help="Training-time budget (from all services up).")
    p.add_argument("--out", default="jetrl-bench/smollm2-addition", help="Run dirs (logs, state) go here.")
    p.add_argument("--no-eval", action="store_true", help="Skip the held-out evaluations (speed only).")
    p.add_argument("--target", type=float, default=0.45, help="The held-out accuracy bar drawn on the plot.")
    p.add_argument("overrides", nargs="*", help="Config overrides key=value (e.g. launch.torch_threads=2).")
    args = p.parse_args()
    args.overrides.insert(0, "schedule.total_steps=100000")  # the budget ends the run
    res = asyncio.run(run(args))
    print(json.dumps(res, indent=1))
    st = res["stage_s"]
    print(f"training: {res['train_s']} s, {res['steps']} steps, {res['completions']} completions, "
          f"{res['s_per_step']} s/step; stages (s): " + ", ".join(f"{k} {v}" for k, v in st.items()))
    print(f"peak RSS: trainer {res['peak_rss_gb']['trainer']} GB, rollout {res['peak_rss_gb']['rollout']} GB")
    if "heldout_before" in res:
        print(f"held-out accuracy: {res['heldout_before']:.3f} -> {res['heldout_after']:.3f} "
              f"(version 0 -> {res['final_version']})")
    if "tool_call_rate_before" in res:
        print(f"held-out tool-call rate: {res['tool_call_rate_before']:.3f} -> {res['tool_call_rate_after']:.3f}; "
              f"tool calls per episode {res['tool_calls_per_episode_before']:.2f} -> "
              f"{res['tool_calls_per_episode_after']:.2f}")
    print(f"smollm2_tokens_per_s: {res['generated_tokens_per_s']}")
    print(f"smollm2_completions_per_s: {res['completions_per_s']}")


if __name__ == "__main__":
    main()
