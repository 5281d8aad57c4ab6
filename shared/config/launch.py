"""How `jetrl up` supervises the processes of a run on one host."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from shared.config.base import Section


class LaunchConfig(Section):
    dataset: str = Field(
        "", description="JSONL/Parquet file `jetrl up` registers and enqueues at start when --dataset is not given "
        "(relative to the working directory; '' = enqueue nothing)."
    )
    epochs: int = Field(1, ge=1, description="Passes over launch.dataset (the --epochs flag wins).")
    shuffle_seed: int | None = Field(
        None, description="Shuffle launch.dataset per epoch with this seed (None = file order; --shuffle-seed wins)."
    )
    sampling: Literal["uniform", "learnable-first"] = Field(
        "uniform",
        description="Which not-yet-released prompt of the current epoch the controller releases next. uniform: "
        "the epoch's order (file order, or shuffled by shuffle_seed). learnable-first: by the prompt memory of "
        "every run on the same data (docs/controller.md, 'Prompt memory'): prompts whose last observation had "
        "a reward spread first, then unseen ones, then seen ones without spread, then never-solved, then "
        "always-solved last; ties in the epoch's order. Either way each prompt goes once per epoch.",
    )
    torch_threads: int = Field(
        0, ge=0,
        description="OMP_NUM_THREADS of each torch process `jetrl up` starts (rollout workers, trainer ranks, eval); "
        "0 = auto (see docs/launch.md, 'Cores'). An OMP_NUM_THREADS in the launcher's environment wins.",
    )
    crash_loop_restarts: int = Field(
        5, ge=1,
        description="A child that exits with an error this many times within crash_loop_window_s stops the whole "
        "`jetrl up` run, printing its last log lines, instead of being restarted for ever.",
    )
    crash_loop_window_s: float = Field(
        300.0, gt=0, description="The window (seconds) in which crash_loop_restarts failures count as a crash loop."
    )
    error_lines: int = Field(20, ge=1, description="Last log lines of a crash-looping child shown when the run stops.")
    private_files: bool = Field(
        True, description="The run dir is private to the user running `jetrl up` / `jetrl demo`: umask 077 for the "
        "launcher and every service it starts (directories 0700, files 0600: logs, datasets, hf-cache, weights, "
        "checkpoints), and what the run dir already holds loses group/other access at start. false = the "
        "umask of the shell (often 0644 files in 0755 dirs, readable by every user of the host).",
    )
