"""Offline scoring of a JSONL file: `jetrl reward score --task NAME --input in.jsonl [--output out.jsonl]`.

Each row is one RewardRequest with one completion, scored by the same ScoringEngine the service
uses; the row is written back with `reward` and `error` (null when scored). A row that is not JSON
or lacks the completion field is written with reward 0 and the reason, never skipped.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reward_service.engine import ScoringEngine
from shared.config import RewardConfig
from shared.contract.messages import RewardRequest


@dataclass
class OfflineFields:
    completion: str = "completion"
    reference: str = "reference"
    payload: str = ""


@dataclass
class OfflineSummary:
    rows: int = 0
    errors: int = 0
    reward_sum: float = 0.0
    output: str = ""

    def line(self) -> str:
        mean = self.reward_sum / self.rows if self.rows else 0.0
        return f"scored {self.rows} rows, mean reward {mean:.4f}, {self.errors} with errors -> {self.output}"


async def _score_row(engine: ScoringEngine, task: str, line_no: int, line: str, f: OfflineFields) -> dict:
    try:
        row: Any = json.loads(line)
    except ValueError as exc:
        return {"line": line_no, "reward": 0.0, "error": f"line {line_no} is not JSON: {exc}"}
    if not isinstance(row, dict):
        return {"line": line_no, "reward": 0.0, "error": f"line {line_no} is a {type(row).__name__}, not an object"}
    completion = row.get(f.completion)
    payload = row.get(f.payload, {}) if f.payload else {}
    if not isinstance(completion, str):
        error = (f"field {f.completion!r} is missing" if completion is None
                 else f"field {f.completion!r} is a {type(completion).__name__}, not a string")
    elif not isinstance(payload, dict):
        error = f"field {f.payload!r} is not an object"
    else:
        req = RewardRequest(task=task, completions=[completion], reference=row.get(f.reference), payload=payload,
                            request_id=str(line_no))
        result = await engine.score_request(req)
        row["reward"] = result.rewards[0] if result.rewards else 0.0
        row["error"] = (result.errors[0] if result.errors else None) or result.error
        return row
    row["reward"], row["error"] = 0.0, f"line {line_no}: {error}"
    return row


async def score_file(cfg: RewardConfig, input_path: str, output_path: str | None = None,
                     fields: OfflineFields | None = None, concurrency: int | None = None,
                     progress: bool = False) -> OfflineSummary:
    fields = fields or OfflineFields()
    src = Path(input_path)
    if not src.is_file():
        raise OSError(f"--input {input_path}: no such file")
    dst = Path(output_path) if output_path else src.with_suffix(".scored.jsonl")
    if dst.resolve() == src.resolve():
        raise ValueError("--output must differ from --input")
    lines = [ln for ln in src.read_text(encoding="utf-8").splitlines()]
    numbered = [(i + 1, ln) for i, ln in enumerate(lines) if ln.strip()]
    window = concurrency or cfg.concurrency
    engine = ScoringEngine(cfg)
    await engine.start()
    summary = OfflineSummary(output=str(dst))
    bar = None
    if progress:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        bar = Progress(TextColumn(f"scoring {engine.task}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
        bar.start()
        tid = bar.add_task("score", total=len(numbered))
    try:
        with open(dst, "w", encoding="utf-8") as out:
            for start in range(0, len(numbered), window):
                chunk = numbered[start:start + window]
                rows = await asyncio.gather(*(_score_row(engine, engine.task, n, ln, fields) for n, ln in chunk))
                for row in rows:
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
                    summary.rows += 1
                    summary.reward_sum += float(row.get("reward", 0.0))
                    summary.errors += 1 if row.get("error") else 0
                if bar is not None:
                    bar.update(tid, advance=len(chunk))
    finally:
        if bar is not None:
            bar.stop()
        await engine.close()
    return summary
