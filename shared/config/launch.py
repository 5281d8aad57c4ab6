"""How `jetrl up` supervises the processes of a run on one host."""

from __future__ import annotations

from pydantic import Field

from shared.config.base import Section


class LaunchConfig(Section):
    crash_loop_restarts: int = Field(
        5, ge=1,
        description="A child that exits with an error this many times within crash_loop_window_s stops the whole "
        "`jetrl up` run, printing its last log lines, instead of being restarted for ever.",
    )
    crash_loop_window_s: float = Field(
        300.0, gt=0, description="The window (seconds) in which crash_loop_restarts failures count as a crash loop."
    )
    error_lines: int = Field(20, ge=1, description="Last log lines of a crash-looping child shown when the run stops.")
