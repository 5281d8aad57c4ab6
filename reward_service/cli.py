"""`jetrl reward serve | score | check` (docs/reward.md)."""

from __future__ import annotations

import typer

from shared.runtime.cliutil import CONFIG_OPTION, OVERRIDES_ARG, load_or_exit, run_async

reward_app = typer.Typer(help="Reward scoring: the NATS service, offline scoring, conformance checks.",
                         no_args_is_help=True)

TASK_OPTION = typer.Option(None, "--task", "-t", help="Reward task (default: reward.task of the config).")


def _config(config: str | None, overrides: list[str] | None, task: str | None):
    cfg = load_or_exit(config, overrides)
    if task:
        from shared.contract.subjects import check_token

        try:
            check_token(task, "reward task")
        except ValueError as exc:
            typer.secho(f"--task: {exc}", fg="red", err=True)
            raise typer.Exit(2) from None
        cfg.reward.task = task
    return cfg


def _scorer_or_exit(cfg) -> None:
    import importlib

    from reward_service.scorers import ScorerError, is_judge, load_scorer, scorer_ref

    if is_judge(cfg.reward.task, cfg.reward.scorer):
        from reward_service.judge.judge import Judge

        try:  # its templates, backend settings and key file (a SecretFileError is a ValueError), before serving
            Judge(cfg.reward.judge)
        except ValueError as exc:
            typer.secho(f"config error: {exc}", fg="red", err=True)
            raise typer.Exit(2) from None
        return
    try:
        fn = load_scorer(scorer_ref(cfg.reward.task, cfg.reward.scorer))
        configure = getattr(importlib.import_module(fn.__module__), "configure", None)
        if configure is not None:
            configure(cfg.reward)
    except ScorerError as exc:
        typer.secho(f"config error: reward.scorer: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None


@reward_app.command("serve")
def serve_cmd(
    config: str = CONFIG_OPTION,
    task: str = TASK_OPTION,
    concurrency: int = typer.Option(None, "--concurrency", "-n", min=1, help="Requests scored at once."),
    overrides: list[str] = OVERRIDES_ARG,
) -> None:
    """Serve jetrl.reward.<task> (queue group jetrl-reward) until SIGTERM / Ctrl-C."""
    from reward_service.service import serve
    from shared.runtime.telemetry import setup_logging

    cfg = _config(config, overrides, task)
    setup_logging(cfg.telemetry, "reward")
    _scorer_or_exit(cfg)
    run_async(serve(cfg, cfg.reward.task, concurrency))


@reward_app.command("score")
def score_cmd(
    input: str = typer.Option(..., "--input", "-i", help="JSONL file of rows to score."),
    output: str = typer.Option(None, "--output", "-o", help="JSONL to write (default: <input>.scored.jsonl)."),
    config: str = CONFIG_OPTION,
    task: str = TASK_OPTION,
    completion_field: str = typer.Option("completion", help="Field holding the completion text."),
    reference_field: str = typer.Option("reference", help="Field holding the reference."),
    payload_field: str = typer.Option("", help="Field holding the payload map ('' = none)."),
    concurrency: int = typer.Option(None, "--concurrency", "-n", min=1, help="Rows scored at once."),
    overrides: list[str] = OVERRIDES_ARG,
) -> None:
    """Score a JSONL file offline with the same engine as the service; writes reward and error per row."""
    from reward_service.offline import OfflineFields, score_file

    cfg = _config(config, overrides, task)
    _scorer_or_exit(cfg)
    fields = OfflineFields(completion_field, reference_field, payload_field)
    try:
        summary = run_async(score_file(cfg.reward, input, output, fields, concurrency, progress=True))
    except (OSError, ValueError) as exc:
        typer.secho(f"error: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    typer.echo(summary.line())


@reward_app.command("check")
def check_cmd(
    config: str = CONFIG_OPTION,
    task: str = TASK_OPTION,
    server: list[str] = typer.Option([], "--server", "-s",
                                     help="NATS server URL to check against (repeatable; replaces nats.servers of the "
                                          "config; credentials still come from the config or JETRL_NATS_* env)."),
    cases_file: str = typer.Option("", "--cases", help="Known cases of a custom task, JSON lines: "
                                   '{"completions": [...], "reference": ..., "rewards": [...], "payload": {...}}.'),
    max_completions: int = typer.Option(4096, "--max-completions", min=1,
                                        help="The service's reward.max_completions: one more must be refused."),
    requests: int = typer.Option(200, "--requests", help="Valid requests timed for the latency percentiles."),
    timeout: float = typer.Option(10.0, help="Seconds to wait for each reply."),
    overrides: list[str] = OVERRIDES_ARG,
) -> None:
    """Check whatever answers jetrl.reward.<task> against the protocol (discovery, queue group, valid and broken
    requests, completion_ids, timeout_s, max_completions, known answers); exit 1 if a case fails."""
    from reward_service.check import check_main, load_cases

    cfg = _config(config, overrides, task)
    if server:
        cfg.nats.servers = list(server)
    known = None
    if cases_file:
        try:
            known = load_cases(cases_file)
        except (OSError, ValueError) as exc:
            typer.secho(f"--cases: {exc}", fg="red", err=True)
            raise typer.Exit(2) from None
    ok = run_async(check_main(cfg, cfg.reward.task, requests, timeout, known, max_completions))
    raise typer.Exit(0 if ok else 1)


def register(app: typer.Typer) -> None:
    app.add_typer(reward_app, name="reward")
