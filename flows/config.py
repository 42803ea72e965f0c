"""Configs: YAML files validated by pydantic models, with `--set dotted.key=value` overrides.

Every error names the key and what was expected, and is raised before any work starts.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from quipu.catalog.errors import UserError

M = TypeVar("M", bound=BaseModel)


class ConfigError(UserError, ValueError):
    """A config that cannot be used; the message is meant for the user as it is."""


def parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected dotted.key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {item!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {key}: value {raw!r} is not valid YAML ({e.problem})") from None
    return key.split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for item in overrides or []:
        path, value = parse_override(item)
        node = data
        for i, part in enumerate(path[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            elif not isinstance(nxt, dict):
                raise ConfigError(f"--set {'.'.join(path)}: '{'.'.join(path[:i + 1])}' is a value, not a section")
            node = nxt
        node[path[-1]] = value
    return data


def format_validation_error(err: ValidationError, source: str = "config") -> str:
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        got = e.get("input")
        got_s = "" if e["type"] in ("extra_forbidden", "missing") else f" (got {got!r:.80})"
        lines.append(f"{source}: {key}: {msg}{got_s}")
    return "\n".join(lines)


def read_yaml(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys at the top level, got {type(data).__name__}")
    return data


def load_config(model: type[M], path: str | Path | None = None, overrides: list[str] | None = None,
                data: dict | None = None) -> M:
    """Build `model` from a YAML file (or a dict), then `--set` overrides; errors name the key."""
    raw = dict(data or {})
    if path is not None:
        raw = read_yaml(path)
    raw = apply_overrides(raw, overrides or [])
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, str(path) if path else "config")) from None


def add_config_args(p: argparse.ArgumentParser, config_required: bool = True) -> None:
    """A command's config file argument and its `--set` overrides."""
    if config_required:
        p.add_argument("config", help="YAML config file")
    else:
        p.add_argument("config", nargs="?", help="YAML config file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (dotted key, YAML value); repeatable")
