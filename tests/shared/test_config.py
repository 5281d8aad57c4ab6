"""Typed config: YAML file, JETRL__ env vars, a.b.c=value overrides; errors name source and field."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import yaml

from shared.config import ConfigError, JetrlConfig, NatsConfig, dump_config, load_config

YAML = textwrap.dedent("""\
    run: exp1
    schedule:
      max_staleness: 2
      batch_size: 4
    nats:
      servers:
        - nats://10.0.0.1:4222
        - nats://10.0.0.2:4222
      sync_interval: 10s
    streams:
      replicas: 3
""")


def write(tmp_path, text: str):
    p = tmp_path / "run.yaml"
    p.write_text(text)
    return p


def test_defaults_need_no_file():
    cfg = load_config(JetrlConfig, env={})
    assert cfg.run == "demo" and cfg.nats.max_payload == 8 * 1024 * 1024 and cfg.streams.replicas == 1


def test_yaml_then_env_then_overrides_with_later_winning(tmp_path):
    env = {"JETRL__SCHEDULE__BATCH_SIZE": "16", "JETRL__SCHEDULE__MAX_STALENESS": "3", "JETRL__NATS__TOKEN": "s3cret",
           "UNRELATED": "x"}
    cfg = load_config(JetrlConfig, write(tmp_path, YAML), ["schedule.max_staleness=0", "nats.embedded=true"], env)
    assert cfg.run == "exp1"
    assert cfg.schedule.batch_size == 16  # env beats the file
    assert cfg.schedule.max_staleness == 0  # the override beats env and file
    assert cfg.nats.servers == ["nats://10.0.0.1:4222", "nats://10.0.0.2:4222"]
    assert cfg.nats.embedded is True and cfg.nats.token == "s3cret" and cfg.nats.sync_interval == "10s"
    assert cfg.streams.replicas == 3


def test_override_values_are_yaml_but_strings_stay_strings():
    cfg = load_config(JetrlConfig, overrides=["nats.servers=[nats://a:1, nats://b:2]", "run=123",
                                              "nats.password=0042", "streams.duplicate_window_s=1e2"], env={})
    assert cfg.nats.servers == ["nats://a:1", "nats://b:2"]
    assert cfg.run == "123" and cfg.nats.password == "0042"
    assert cfg.streams.duplicate_window_s == 100.0


def test_invalid_value_in_the_file_names_file_line_and_dotted_field(tmp_path):
    bad = YAML.replace("batch_size: 4", "batch_size: 0")
    with pytest.raises(ConfigError) as info:
        load_config(JetrlConfig, write(tmp_path, bad), env={})
    err = info.value
    assert err.source == f"{tmp_path / 'run.yaml'}:4" and err.field == "schedule.batch_size"
    assert "greater than or equal to 1" in err.reason and "got 0" in err.reason
    assert str(err).startswith(f"{tmp_path / 'run.yaml'}:4: schedule.batch_size:")


def test_unknown_key_is_an_error_naming_it(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(JetrlConfig, write(tmp_path, YAML.replace("max_staleness", "max_stalness")), env={})
    assert info.value.field == "schedule.max_stalness" and info.value.source.endswith("run.yaml:3")
    assert "Extra inputs are not permitted" in info.value.reason


def test_bad_list_item_names_its_index_and_line(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(JetrlConfig, write(tmp_path, YAML.replace("- nats://10.0.0.2:4222", "- {a: 1}")), env={})
    assert info.value.field == "nats.servers.1" and info.value.source.endswith("run.yaml:8")


def test_errors_from_env_and_overrides_name_the_variable_or_override():
    with pytest.raises(ConfigError) as info:
        load_config(JetrlConfig, env={"JETRL__NATS__SYNC_INTERVAL": "sometimes"})
    assert info.value.source == "env JETRL__NATS__SYNC_INTERVAL" and info.value.field == "nats.sync_interval"
    assert "'always'" in info.value.reason
    with pytest.raises(ConfigError) as info:
        load_config(JetrlConfig, overrides=["streams.replicas=9"], env={})
    assert info.value.source == "override 'streams.replicas=9'" and info.value.field == "streams.replicas"
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(JetrlConfig, overrides=["streams.replicas"], env={})
    with pytest.raises(ConfigError, match="'run' is a value, not a section"):
        load_config(JetrlConfig, overrides=["run=a", "run.x=1"], env={})
    with pytest.raises(ConfigError) as info:
        load_config(JetrlConfig, overrides=["run.x=1"], env={})
    assert info.value.source == "override 'run.x=1'" and info.value.field == "run"
    with pytest.raises(ConfigError) as info:
        load_config(JetrlConfig, overrides=["run=bad id!"], env={})
    assert info.value.field == "run" and "A-Z a-z 0-9" in info.value.reason


def test_missing_or_malformed_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(JetrlConfig, tmp_path / "nope.yaml", env={})
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(JetrlConfig, write(tmp_path, "schedule: [unclosed\n"), env={})
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(JetrlConfig, write(tmp_path, "- a\n- b\n"), env={})


def test_a_single_section_loads_on_its_own():
    cfg = load_config(NatsConfig, overrides=["embedded=true", "port=4333"], env={"JETRL__USER": "bob"})
    assert cfg.embedded and cfg.port == 4333 and cfg.user == "bob"


def test_dumped_config_loads_back_to_the_same_config(tmp_path):
    cfg = load_config(JetrlConfig, write(tmp_path, YAML), ["schedule.batch_size=32"], env={})
    again = load_config(JetrlConfig, write(tmp_path, dump_config(cfg)), env={})
    assert again == cfg


def test_config_show_prints_the_resolved_config_and_fails_naming_the_field(tmp_path):
    path = write(tmp_path, YAML)
    env = {"PATH": "/usr/bin:/bin", "JETRL__STREAMS__REPLICAS": "5"}
    code = "from launcher.cli import main; main()"
    ok = subprocess.run([sys.executable, "-c", code, "config", "show", "-c", str(path), "schedule.batch_size=7"],
                        capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    shown = yaml.safe_load(ok.stdout)
    assert shown["run"] == "exp1" and shown["schedule"]["batch_size"] == 7 and shown["streams"]["replicas"] == 5
    bad = subprocess.run([sys.executable, "-c", code, "config", "show", "-c", str(path), "schedule.batch_size=-1"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "schedule.batch_size" in bad.stderr and "override" in bad.stderr
