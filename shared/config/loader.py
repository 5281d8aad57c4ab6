"""Load a config model from YAML, then environment variables, then `a.b.c=value` overrides.

Precedence (later wins): model defaults < YAML file < env `JETRL__A__B=value` < command-line overrides.
Values from env and overrides are parsed as YAML scalars/flow ("8", "true", "[a, b]"); where a string
field gets one that YAML read as a number or bool (`run=123`, `nats.password=0042`), the original text
is used.
An invalid value raises ConfigError naming the file (and line, when it came from the file), the dotted
field and the reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)

ENV_PREFIX = "JETRL__"


class ConfigError(ValueError):
    """A config value is invalid. Carries `source` (file[:line], env var or override) and `field`."""

    def __init__(self, source: str, field: str, reason: str):
        super().__init__(f"{source}: {field}: {reason}" if field else f"{source}: {reason}")
        self.source = source
        self.field = field
        self.reason = reason


def _yaml_lines(text: str) -> dict[str, int]:
    """Map dotted key paths of a YAML document to their 1-based line numbers."""
    lines: dict[str, int] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                path = f"{prefix}.{key.value}" if prefix else str(key.value)
                lines[path] = key.start_mark.line + 1
                walk(value, path)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                path = f"{prefix}.{i}"
                lines[path] = item.start_mark.line + 1
                walk(item, path)

    try:
        walk(safe_yaml_compose(text), "")
    except yaml.YAMLError:
        pass
    return lines


def _set_dotted(data: dict, dotted: str, value: Any, source: str) -> None:
    keys = dotted.split(".")
    if not all(keys):
        raise ConfigError(source, dotted, "empty key in dotted path")
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ConfigError(source, dotted, f"'{key}' is a value, not a section")
        node = child
    node[keys[-1]] = value


def _parse_scalar(text: str) -> Any:
    try:
        return safe_yaml_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r}", "", "expected KEY=VALUE, e.g. trainer.lr=3e-4")
    key, _, value = item.partition("=")
    return key.strip(), _parse_scalar(value)


def load_config(
    model: type[M],
    path: str | os.PathLike | None = None,
    overrides: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    data: dict | None = None,
) -> M:
    """Build `model` from defaults, an optional YAML file (or `data` dict), env and overrides."""
    merged: dict = {}
    origin: dict[str, str] = {}  # dotted key -> where its value came from
    file_label = ""
    if path:
        file_label = str(path)
        p = Path(path)
        if not p.is_file():
            raise ConfigError(file_label, "", "config file not found")
        text = p.read_text()
        try:
            loaded = safe_yaml_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(file_label, "", f"not valid YAML: {exc}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(file_label, "", "the top level must be a mapping of sections")
        merged = loaded
        origin = {k: f"{file_label}:{line}" for k, line in _yaml_lines(text).items()}
    elif data is not None:
        merged = dict(data)
        file_label = "<data>"

    env = os.environ if env is None else env
    raw_text: dict[str, str] = {}  # dotted -> the text an env var / override gave, before YAML parsing
    for name, value in env.items():
        if name.startswith(ENV_PREFIX) and len(name) > len(ENV_PREFIX):
            dotted = name[len(ENV_PREFIX) :].lower().replace("__", ".")
            _set_dotted(merged, dotted, _parse_scalar(value), f"env {name}")
            origin[dotted] = f"env {name}"
            raw_text[dotted] = value
    for item in overrides:
        dotted, value = parse_override(item)
        _set_dotted(merged, dotted, value, f"override {item!r}")
        origin[dotted] = f"override {item!r}"
        raw_text[dotted] = item.partition("=")[2]

    for _ in range(len(raw_text) + 1):
        try:
            return model.model_validate(merged)
        except ValidationError as exc:
            errors = exc.errors()
            if not _use_raw_text_for_strings(merged, errors, raw_text):
                break
    err = errors[0]
    dotted = ".".join(str(p) for p in err["loc"])
    source = _origin_of(dotted, origin) or file_label or "config"
    got = err.get("input")
    shown = f" (got {got!r})" if isinstance(got, (str, int, float, bool, type(None))) and err["loc"] else ""
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    raise ConfigError(source, dotted, f"{err['msg']}{shown}{more}")


def _use_raw_text_for_strings(merged: dict, errors: list, raw_text: dict[str, str]) -> bool:
    """Where a string field got a YAML-parsed number/bool from env or an override, put back the text."""
    changed = False
    for err in errors:
        dotted = ".".join(str(p) for p in err["loc"])
        if err["type"] == "string_type" and dotted in raw_text and not isinstance(err.get("input"), str):
            _set_dotted(merged, dotted, raw_text.pop(dotted), "")
            changed = True
    return changed


def _origin_of(dotted: str, origin: dict[str, str]) -> str | None:
    parts = dotted.split(".")
    while parts:
        key = ".".join(parts)
        if key in origin:
            return origin[key]
        parts.pop()
    for key, where in origin.items():  # a value set below this field (`run.x=1` for a string `run`)
        if key.startswith(dotted + "."):
            return where
    return None


def dump_config(cfg: BaseModel, redact: bool = True) -> str:
    """The resolved config as YAML (what `jetrl config show` prints), secrets replaced by REDACTED unless
    `redact` is false (shared/runtime/credentials.py)."""
    from shared.runtime.credentials import redacted_dump

    return yaml.safe_dump(redacted_dump(cfg) if redact else cfg.model_dump(mode="json"), sort_keys=False)


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases: `*name` is refused where it appears. Aliases let a few hundred
    bytes expand to gigabytes (nested aliases) or loop for ever (an alias to its own parent), and a config
    never needs them."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"found alias *{event.anchor}: YAML aliases (and << merges) are not accepted in jetrl "
                "configs; write the value out", event.start_mark)
        return super().compose_node(parent, index)


def safe_yaml_load(text: str):
    """yaml.safe_load without aliases; yaml.YAMLError for bad YAML or any alias, and for nesting too
    deep for the parser (RecursionError)."""
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None


def safe_yaml_compose(text: str):
    try:
        return yaml.compose(text, Loader=_NoAliasLoader)
    except RecursionError:
        raise yaml.YAMLError("nested too deeply") from None
