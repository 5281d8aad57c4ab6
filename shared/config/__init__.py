"""Typed configuration of a jetrl run and its services.

One section per concern, each in its own module (documented field by field where defined);
`JetrlConfig` is the whole run, as a YAML file holds it. Load with `load_config(JetrlConfig, path,
overrides)`. Every service reads the same file and uses the sections it needs.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from shared.config.base import Section
from shared.config.common import ModelConfig, ScheduleConfig, TelemetryConfig
from shared.config.controller import ControllerConfig
from shared.config.eval import EvalConfig
from shared.config.launch import LaunchConfig
from shared.config.loader import ConfigError, dump_config, load_config, parse_override, safe_yaml_load
from shared.config.nats import NatsConfig, StreamsConfig
from shared.config.reward import RewardConfig
from shared.config.rollout import RolloutConfig, SamplingConfig
from shared.config.tracking import TrackingConfig
from shared.config.trainer import TrainerConfig
from shared.config.weights import WeightStoreConfig


class JetrlConfig(Section):
    """A whole run: every service of it reads this file."""

    run: str = Field("demo", description="Run id: names subjects, consumers and weight-store paths.")
    nats: NatsConfig = Field(default_factory=NatsConfig)
    streams: StreamsConfig = Field(default_factory=StreamsConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    weights: WeightStoreConfig = Field(default_factory=WeightStoreConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    controller: ControllerConfig = Field(default_factory=ControllerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    launch: LaunchConfig = Field(default_factory=LaunchConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    @field_validator("run")
    @classmethod
    def _check_run(cls, v: str) -> str:
        from shared.contract.subjects import check_run_id

        return check_run_id(v)


__all__ = [
    "ConfigError",
    "ControllerConfig",
    "EvalConfig",
    "JetrlConfig",
    "LaunchConfig",
    "ModelConfig",
    "NatsConfig",
    "RewardConfig",
    "RolloutConfig",
    "SamplingConfig",
    "ScheduleConfig",
    "Section",
    "StreamsConfig",
    "TelemetryConfig",
    "TrackingConfig",
    "TrainerConfig",
    "WeightStoreConfig",
    "dump_config",
    "load_config",
    "parse_override",
    "safe_yaml_load",
]
