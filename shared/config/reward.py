"""Reward service and its client."""

from __future__ import annotations

from pydantic import Field

from shared.config.base import Section


class RewardConfig(Section):
    task: str = Field("gsm8k", description="Reward task: a built-in scorer name, served on jetrl.reward.<task>.")
    scorer: str = Field("", description="Custom scorer as 'package.module:function' ('' = the built-in for `task`).")
    concurrency: int = Field(64, ge=1, description="Requests one service process scores at once.")
    processes: int = Field(0, ge=0, description="Process pool for CPU-heavy scorers (0 = score in the event loop's executor).")
    timeout_s: float = Field(10.0, gt=0, description="Client: time to wait for one reply before retrying.")
    retries: int = Field(3, ge=0, description="Client: retries on timeout or no responders.")
    scorer_timeout_s: float = Field(5.0, gt=0, description="Service: time limit of one scoring call.")
