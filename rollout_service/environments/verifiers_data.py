"""A verifiers environment's dataset as jetrl rows: train.jsonl and heldout.jsonl for `jetrl up` / `jetrl eval`
with the verifiers adapter (rollout_service/environments/verifiers_env.py).

    python -m rollout_service.environments.verifiers_data --env examples.verifiers_env \\
        [--env-args '{"num_train": 200}'] --out examples/data/verifiers [--heldout 50] [--limit 0]

Training rows are the environment's `dataset` (the first `--limit` rows, 0 = all), in its order; held-out rows
the first `--heldout` rows of its `eval_dataset`, or, when it has none, the last `--heldout` rows of
`dataset` (then left out of training). A row:

    {"messages": [...the prompt...],                       # or "prompt": text (see below)
     "reference": "<the row's answer>",
     "metadata": {"verifiers_env": ENV, "split": "train", "verifiers": {<the dataset row as verifiers formats
                  it: prompt, example_id, answer, info, task and any other column>}}}

`metadata.verifiers` is what the adapter gives the environment's rollout, so it must stay as written.
`messages` / `prompt` / `reference` are for jetrl's own views (the dashboard, the ledger, the reward service):
the prompt's messages when each is a plain {role, content} text message, else `prompt`, the messages'
texts joined by blank lines. Rows must be plain JSON (verifiers' Arrow datasets usually are).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rollout_service.environments.verifiers_env import VerifiersEnvError, load_environment
from shared.io.jsonl import check_plain, write_split


def display_prompt(prompt) -> dict:
    """{"messages": [...]} when the prompt is plain text messages, else {"prompt": its text}."""
    if isinstance(prompt, str):
        return {"prompt": prompt}
    msgs = [{k: v for k, v in dict(m).items() if v is not None} for m in prompt]
    if msgs and all(set(m) == {"role", "content"} and isinstance(m["content"], str) for m in msgs):
        return {"messages": msgs}
    texts = [
        m.get("content") if isinstance(m.get("content"), str) else json.dumps(m.get("content")) for m in msgs
    ]
    return {"prompt": "\n\n".join(t for t in texts if t) or json.dumps(msgs)}


def jetrl_row(row: dict, env: str, split: str, index: int) -> dict:
    """One jetrl dataset row from one verifiers dataset row."""
    try:
        plain = json.loads(json.dumps(row, allow_nan=False))
        check_plain(plain)
    except (TypeError, ValueError) as exc:
        raise SystemExit(
            f"{env}: row {index} of its {split} dataset is not plain JSON ({exc}); jetrl carries rows as JSON"
        ) from None
    if "prompt" not in plain:
        raise SystemExit(
            f"{env}: row {index} of its {split} dataset has no prompt (columns: {sorted(plain)})"
        )
    answer = plain.get("answer")
    return {
        **display_prompt(plain["prompt"]),
        "reference": "" if answer is None else answer,
        "metadata": {"verifiers_env": env, "split": split, "verifiers": plain},
    }


def build(env: str, env_args: dict | None, heldout: int, limit: int) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows) of the environment `env` built with `env_args`."""
    environment = load_environment(env, env_args)
    train_ds, eval_ds = environment.build_dataset(), environment.build_eval_dataset()
    if train_ds is None:
        raise SystemExit(f"{env} has no training dataset (only an eval_dataset): nothing to train on")
    train = list(train_ds)
    if eval_ds is not None:
        held = list(eval_ds)[:heldout]
    else:
        if heldout >= len(train):
            raise SystemExit(
                f"{env} has {len(train)} rows and no eval_dataset: ask for fewer than that held out"
            )
        held, train = train[len(train) - heldout :], train[: len(train) - heldout]
    if limit:
        train = train[:limit]
    return (
        [jetrl_row(r, env, "train", i) for i, r in enumerate(train)],
        [jetrl_row(r, env, "heldout", i) for i, r in enumerate(held)],
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description="Write a verifiers environment's dataset as jetrl's train.jsonl and heldout.jsonl."
    )
    p.add_argument("--env", required=True, help="An installed environment (my-env) or 'package.module:attr'.")
    p.add_argument("--env-args", default="{}", help="JSON object of load_environment's arguments.")
    p.add_argument("--out", required=True, help="Output directory.")
    p.add_argument(
        "--heldout", type=int, default=50, help="Held-out rows (from eval_dataset, else the last rows)."
    )
    p.add_argument("--limit", type=int, default=0, help="At most this many training rows (0 = all).")
    args = p.parse_args(argv)
    try:
        env_args = json.loads(args.env_args)
    except ValueError as exc:
        p.error(f"--env-args is not JSON: {exc}")
    if not isinstance(env_args, dict) or args.heldout < 0 or args.limit < 0:
        p.error("--env-args must be a JSON object, --heldout and --limit >= 0")
    try:
        train, held = build(args.env, env_args, args.heldout, args.limit)
    except VerifiersEnvError as exc:
        raise SystemExit(str(exc)) from None
    for (name, path), rows in zip(
        write_split(Path(args.out), train, held).items(), (train, held), strict=True
    ):
        print(f"{name}: {path} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
