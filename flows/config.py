"""Configs: YAML files validated by pydantic models, with `--set dotted.key=value` overrides.

Every error names the key and what was expected, and is raised before any work starts.
"""
from __future__ import annotations

import argparse
import copy
import difflib
import importlib
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticUndefined

from quipu.catalog.errors import UserError

M = TypeVar("M", bound=BaseModel)


class ConfigError(UserError, ValueError):
    """A config that cannot be used; the message is meant for the user as it is."""


MAX_YAML_VALUES = 100_000   # values a config may expand to, aliases counted at every use
CHARS_PER_VALUE = 64        # a scalar counts one value per this many characters: 6.4 MB of text at most


def load_yaml(text: str, source: str = "config") -> Any:
    """yaml.safe_load, refusing documents whose aliases expand past `MAX_YAML_VALUES` values (a 2 KB
    "billion laughs" file is small as a graph but exponential to validate or print)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        n = _expanded_size(node, {}, MAX_YAML_VALUES)
        if n > MAX_YAML_VALUES:
            raise ConfigError(f"{source}: its YAML aliases expand to more than {MAX_YAML_VALUES:,} values "
                              f"(or {MAX_YAML_VALUES * CHARS_PER_VALUE // 1_000_000} MB of text; an alias bomb?): "
                              "write the values out, or use fewer aliases")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_size(node, memo: dict, limit: int) -> int:
    """Values under `node` with every alias expanded; stops counting past `limit`."""
    key = id(node)
    if key in memo:
        return memo[key]
    memo[key] = limit + 1   # a cycle counts as too large
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    else:
        children = []
    total = 1 + (len(node.value) // CHARS_PER_VALUE if isinstance(node, yaml.ScalarNode) else 0)
    for child in children:
        total += _expanded_size(child, memo, limit)
        if total > limit:
            break
    memo[key] = total
    return total


def short_repr(value: Any, chars: int = 80) -> str:
    """repr() of a value from a bounded prefix: nested containers cut before they are formatted."""
    import reprlib
    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxdict, r.maxtuple, r.maxset, r.maxstring, r.maxother = 3, 8, 8, 8, 8, chars, chars
    return r.repr(value)[:chars]


def parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected dotted.key=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"--set {short_repr(item)}: empty key")
    if not key.isprintable():
        raise ConfigError(f"--set {short_repr(key)}: a key with a control character")
    try:
        value = load_yaml(raw, f"--set {key}") if raw.strip() else ""
    except yaml.YAMLError as e:    # a control character is a ReaderError: no `problem`
        why = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"--set {key!r}: value {short_repr(raw)} is not valid YAML ({why})") from None
    return key.split("."), value


def deep_merge(base: dict, top: dict) -> dict:
    """`top` on `base`: mappings merged key by key, any other value replaced."""
    out = copy.deepcopy(base)
    for k, v in top.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


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


def format_validation_error(err: ValidationError, source: str = "config", model: type[BaseModel] | None = None) -> str:
    lines = []
    errors = err.errors()
    for e in errors[:10]:
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
            if model is not None:
                msg += did_you_mean(model, [str(p) for p in e["loc"]])
        got = e.get("input")
        # a whole section's check (a model validator) names what it looked at: the section is no help
        whole = e["type"] == "value_error" and isinstance(got, dict)
        got_s = "" if e["type"] in ("extra_forbidden", "missing") or whole else f" (got {short_repr(got)})"
        lines.append(f"{source}: {key}: {msg}{got_s}")
    if len(errors) > 10:
        lines.append(f"{source}: ... and {len(errors) - 10:,} more errors")
    return "\n".join(lines)


def read_yaml(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = load_yaml(p.read_text(), str(path)) or {}
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
    source = str(path) if path else "config"
    refuse_non_finite(raw, source)
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, str(path) if path else "config", model)) from None


def refuse_non_finite(value: Any, source: str, key: str = "") -> None:
    """No number in a config is infinite or NaN (YAML's .inf, .nan): every bound, threshold and
    time limit is a finite number; `off` or null switches a rule off."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{source}: {key or '(top level)'}: expected a finite number (got {value}); "
                          "to switch a rule off write `off`")
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        refuse_non_finite(v, source, f"{key}.{k}" if key else str(k))


def add_config_args(p: argparse.ArgumentParser, config_required: bool = True) -> None:
    """A command's config file argument and its `--set` overrides."""
    if config_required:
        p.add_argument("config", help="YAML config file")
    else:
        p.add_argument("config", nargs="?", help="YAML config file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (dotted key, YAML value); repeatable")


# ---- what the configs are: `quipu config show`, "did you mean" -----------------------------------

# Every config a command or deployment takes, by the name users call it (`quipu config show NAME`).
CONFIG_MODELS = {
    "curate": "quipu.flows.curate_config:CurateConfig",
    "train": "quipu.trainer.train:TrainConfig",
    "quality": "quipu.trainer.classifier_train:ClassifierTrainConfig",
    "ppl": "quipu.flows.ppl:PplConfig",
    "kenlm": "quipu.flows.ppl:KenLMTrainConfig",
    "watch": "quipu.flows.watch:WatchConfig",
    "ablate": "quipu.flows.ablate:AblateConfig",
    "label": "quipu.trainer.llm_labels:LabelConfig",
}


def config_model(name: str) -> type[BaseModel]:
    if name not in CONFIG_MODELS:
        raise ConfigError(f"no config named {name!r}; one of: {', '.join(CONFIG_MODELS)}")
    module, attr = CONFIG_MODELS[name].split(":")
    return getattr(importlib.import_module(module), attr)


def _submodels(annotation) -> list[type[BaseModel]]:
    """The pydantic models a field holds directly (X, X | None, Annotated[X, ...])."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        return [m for a in typing.get_args(annotation) for m in _submodels(a)]
    return []


def type_name(annotation) -> str:
    """A field's type as a user reads it: `int`, `str | null`, `list[str]`, `auto | cpu | cuda`."""
    if annotation is type(None):
        return "null"
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in typing.get_args(annotation))
    if origin is typing.Annotated:
        return type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(annotation, "__name__", str(annotation))


def _default(field) -> Any:
    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        value = field.default_factory()
    else:
        return PydanticUndefined
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return json.loads(json.dumps(value, default=str))   # as it reads back from YAML: tuples are lists


def config_keys(model: type[BaseModel], prefix: str = "") -> list[dict]:
    """Every key of `model` as a dotted path with its type, default and description, nested models
    expanded (generated from the model, so it is never out of date)."""
    rows = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        subs = _submodels(field.annotation)
        if len(subs) == 1 and typing.get_origin(field.annotation) is None:
            rows.extend(config_keys(subs[0], key + "."))
            continue
        default = _default(field)
        rows.append({"key": key, "type": type_name(field.annotation),
                     "default": "(required)" if default is PydanticUndefined else default,
                     "description": field.description or ""})
        if typing.get_origin(field.annotation) is list:   # a list of sections: the keys of one item
            for item in _submodels(typing.get_args(field.annotation)[0]):
                rows.extend(config_keys(item, key + "[]."))
        elif len(subs) == 1:   # an optional section (null by default): its keys, should you set it
            rows.extend({**r, "optional": True} for r in config_keys(subs[0], key + "."))
    return rows


def did_you_mean(model: type[BaseModel], loc: list[str]) -> str:
    """`; did you mean 'x'?` for an unknown key at `loc`, from the keys valid at that level."""
    node: type[BaseModel] | None = model
    for part in loc[:-1]:
        if part.isdigit():   # an item of a list of sections: the item's model is already `node`
            continue
        field = node.model_fields.get(part) if node else None
        ann = field.annotation if field else None
        if typing.get_origin(ann) in (list, dict):
            ann = typing.get_args(ann)[-1]
        subs = _submodels(ann) if ann is not None else []
        node = subs[0] if subs else None
    if node is None:
        return ""
    valid = list(node.model_fields)
    close = difflib.get_close_matches(loc[-1], valid, n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{'.'.join([*loc[:-1], close[0]])}'?"
    return f"; valid keys here: {', '.join(valid)}"
