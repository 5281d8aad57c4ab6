"""A τ²-bench domain's tasks as jetrl rows: train.jsonl and heldout.jsonl for `jetrl up` / `jetrl eval` with the
τ²-bench adapter (rollout_service/environments/tau2_env.py).

    python -m rollout_service.environments.tau2_data --domain airline --out data/tau2-airline \\
        [--task-set NAME] [--train-split NAME] [--heldout-split NAME] [--heldout N] [--limit N]

The tasks are τ²-bench's own (its registry's loader for the task set, `--task-set`, default the domain's
name; e.g. telecom_small for telecom). Training rows: the task set's "train" split when it has both "train"
and "test" (airline, retail, telecom), else all its tasks (mock), or `--train-split`; the first `--limit`
of them (0 = all). Held-out rows: the "test" split (or `--heldout-split`) when training came from a split,
its first `--heldout` tasks (default all); with no test split, the last `--heldout` tasks (default none),
then left out of training. A row:

    {"prompt": "<the task's user scenario: persona and instructions>",
     "reference": "<the task's expected actions, one per line, e.g. create_task(user_id='user_1', ...)>",
     "metadata": {"split": "train", "tau2": {"domain": D, "task_set": S, "task_id": ID}}}

`metadata.tau2` is what the adapter plays (it looks the task up by id in τ²-bench's task set); add
`"user_script": ["...", ...]` there for the adapter's scripted user. `prompt` and `reference` are for jetrl's
own views (dashboard, ledger, rollout viewer): the adapter does not read them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rollout_service.environments.tau2_env import Tau2EnvError, check_domain, load_tasks, task_splits
from shared.io.jsonl import write_split


def reference(task) -> str:
    crit = task.evaluation_criteria
    return "\n".join(a.get_func_format() for a in (crit.actions or [])) if crit is not None else ""


def jetrl_row(task, domain: str, task_set: str, split: str) -> dict:
    """One jetrl dataset row for one τ²-bench task."""
    return {
        "prompt": str(task.user_scenario),
        "reference": reference(task),
        "metadata": {"split": split, "tau2": {"domain": domain, "task_set": task_set, "task_id": task.id}},
    }


def build(domain: str, task_set: str | None = None, train_split: str | None = None,
          heldout_split: str | None = None, heldout: int | None = None, limit: int = 0
          ) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows) of a τ²-bench domain's task set (see the module docstring)."""
    check_domain(domain)
    task_set = task_set or domain
    splits = task_splits(task_set)
    for name in (train_split, heldout_split):
        if name is not None and name not in splits:
            raise Tau2EnvError(f"τ²-bench task set {task_set!r} has no split {name!r} "
                               f"(its splits: {', '.join(splits) or 'none'})")
    if train_split is None and heldout_split is None and {"train", "test"} <= set(splits):
        train_split, heldout_split = "train", "test"
    train = load_tasks(task_set, train_split) if train_split else load_tasks(task_set)
    if heldout_split is not None:
        held = load_tasks(task_set, heldout_split)
        held = held if heldout is None else held[:heldout]
        ids = {t.id for t in held}
        if train_split is None:  # all tasks minus the held-out split
            train = [t for t in train if t.id not in ids]
    else:
        n = heldout or 0
        if n >= len(train) and n:
            raise Tau2EnvError(f"τ²-bench task set {task_set!r} has {len(train)} tasks and no test split: ask for "
                               "fewer than that held out")
        held = train[len(train) - n:] if n else []
        train = train[:len(train) - n]
    if limit:
        train = train[:limit]
    return ([jetrl_row(t, domain, task_set, "train") for t in train],
            [jetrl_row(t, domain, task_set, "heldout") for t in held])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description="Write a τ²-bench domain's tasks as jetrl's train.jsonl and heldout.jsonl.")
    p.add_argument("--domain", required=True, help="The τ²-bench domain (mock, airline, retail, telecom, ...).")
    p.add_argument("--task-set", default=None, help="Its task set (default: the domain's name).")
    p.add_argument("--train-split", default=None, help="Training tasks: this split (default: 'train', else all).")
    p.add_argument("--heldout-split", default=None, help="Held-out tasks: this split (default: 'test' if any).")
    p.add_argument("--heldout", type=int, default=None,
                   help="At most this many held-out tasks (of the test split; without one, the last N tasks).")
    p.add_argument("--limit", type=int, default=0, help="At most this many training rows (0 = all).")
    p.add_argument("--out", required=True, help="Output directory.")
    args = p.parse_args(argv)
    if (args.heldout is not None and args.heldout < 0) or args.limit < 0:
        p.error("--heldout and --limit must be >= 0")
    try:
        train, held = build(args.domain, args.task_set, args.train_split, args.heldout_split, args.heldout,
                            args.limit)
    except Tau2EnvError as exc:
        raise SystemExit(str(exc)) from None
    if not train:
        raise SystemExit(f"τ²-bench domain {args.domain!r}: no training tasks selected")
    for (name, path), rows in zip(write_split(Path(args.out), train, held).items(), (train, held), strict=True):
        print(f"{name}: {path} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
