"""Command `quipu config show`: every key of a config, as a dotted path with type, default and
description, generated from its pydantic model (quipu.flows.config.CONFIG_MODELS)."""
from __future__ import annotations

import argparse
import json
import shutil
import textwrap

import yaml


def _cell(value) -> str:
    return value if isinstance(value, str) and value == "(required)" else json.dumps(value, default=str)


def cmd_config_show(args) -> int:
    from quipu.flows.config import CONFIG_MODELS, config_keys, config_model, load_config

    model = config_model(args.name)
    if args.defaults:
        # a complete, valid starting config: every default (required keys left out, they have none)
        defaults = {}
        for row in config_keys(model):
            if row["default"] == "(required)" or row.get("optional"):   # an unset optional section stays null
                continue
            node = defaults
            *parents, last = row["key"].split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[last] = row["default"]
        print(f"# quipu {args.name} config: every key at its default ({CONFIG_MODELS[args.name]})")
        print(yaml.safe_dump(defaults, sort_keys=False, allow_unicode=True), end="")
        return 0
    effective = None
    if args.config:
        effective = load_config(model, args.config, args.overrides).model_dump(mode="json")
    width = shutil.get_terminal_size((120, 20)).columns
    rows = config_keys(model)
    key_w = min(max(len(r["key"]) for r in rows), 40)
    for r in rows:
        line = f"{r['key']:<{key_w}}  {r['type']}  = {_cell(r['default'])}"
        if effective is not None:
            value = effective
            for p in r["key"].split("."):
                value = value.get(p) if isinstance(value, dict) else None
            if value != r["default"]:
                line += f"   (this config: {json.dumps(value, default=str)})"
        print(line)
        if r["description"] and not args.brief:
            for d in textwrap.wrap(r["description"], max(40, width - key_w - 4)):
                print(f"{'':<{key_w}}    {d}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    from quipu.flows.config import CONFIG_MODELS

    p = sub.add_parser("config", help="show the keys of a config (type, default, description)")
    csub = p.add_subparsers(dest="config_command", required=True)
    q = csub.add_parser("show", help="every key of a config as a dotted path, with type, default and description")
    q.add_argument("name", choices=list(CONFIG_MODELS), help="which config")
    q.add_argument("config", nargs="?", help="also show where this YAML file (with --set) differs from the defaults")
    q.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a value of CONFIG (dotted key, YAML value); repeatable")
    q.add_argument("--defaults", action="store_true", help="print a YAML config with every key at its default")
    q.add_argument("--brief", action="store_true", help="keys, types and defaults only")
    q.set_defaults(func=cmd_config_show)
