"""`quipu deploy`: register the deployments of deploy/prefect.yaml with the Prefect server.

deploy/prefect.yaml is the one place deployments, schedules and triggers are defined. It cannot
read other files, so `quipu deploy` resolves it first:

- each deployment's `config` parameter (and the `config` of its triggers' parameters) starts from
  the config file named for it under the top-level `quipu.configs` key, with the YAML's own values
  on top (deep merge), and is validated with the flow's config model before anything is sent; a
  named config file that is missing or invalid fails naming the file (and the key); the other
  parameters are validated against the flow's signature (trigger templates are filled in by the
  server and skipped); the curate deployment keeps its short form instead (the file's name as
  `config_file`, read when the run starts, and the YAML's values: curate_config.form_schema),
  validated as the run will resolve it;
- `{{ $QUIPU_ROOT }}` (the working directory of flow runs) becomes the repository root;
- deployments whose entrypoint file does not exist yet are skipped with a message.

The resolved file is written to `$QUIPU_HOME/deploy/prefect.yaml` and handed to
`prefect --no-prompt deploy --prefect-file … --name …`, after the work pools it names exist.
"""
from __future__ import annotations

import copy
import importlib
import inspect
import typing
import os
import subprocess
import sys
from pathlib import Path

import pydantic
import yaml

from quipu.catalog import db
from quipu.catalog.files import write_bytes_atomic
from quipu.flows.config import ConfigError, apply_overrides, deep_merge, load_config, read_yaml
from quipu.flows.deploy_chain import (CURATE, CURATE_COMPLETED, DATASET_RESOURCE, TRAIN, WATCH, check_chain, fail_on,
                                     has_template, train_trigger_resources)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FILE = ROOT / "deploy" / "prefect.yaml"
ROOT_PLACEHOLDER = "{{ $QUIPU_ROOT }}"

# Config model of each flow entrypoint, to validate the `config` parameter before deploying.
CONFIG_MODELS = {
    "flows/curate.py:curate": "quipu.flows.curate:CurateConfig",
    "flows/watch.py:watch": "quipu.flows.watch:WatchConfig",
    "flows/quality_train.py:quality_train": "quipu.flows.quality_train:ClassifierTrainConfig",
    "flows/ppl.py:ppl_distill": "quipu.flows.ppl:PplConfig",
    "flows/train.py:tokenize_train": "quipu.trainer.train:TrainConfig",
}


def _validate(entrypoint: str, params: dict, where: str, root: Path = ROOT) -> None:
    """The `config` parameter with the flow's config model (errors name the key; curate's form
    with its config file under `root`), then every other concrete parameter against the flow
    function's signature (its type hints)."""
    target = CONFIG_MODELS.get(entrypoint)
    if not target:
        raise ConfigError(f"{where}: no config model known for entrypoint {entrypoint} (add it to CONFIG_MODELS)")
    module, name = target.split(":")
    model = getattr(importlib.import_module(module), name)
    config = params.get("config") or {}
    # Trigger templates are filled in by the server: validate the rest.
    concrete = {k: v for k, v in config.items() if not has_template(v)}
    try:
        if entrypoint == CURATE:
            from quipu.flows.curate_config import from_form
            from_form(concrete, root)
        else:
            load_config(model, None, data=concrete)
    except ConfigError as e:   # names the key; say which deployment and file
        raise ConfigError(f"{where}: {e}") from None
    others = {k: v for k, v in params.items() if k != "config" and not has_template(v)}
    file, func = entrypoint.split(":")
    fn = getattr(importlib.import_module("quipu." + file.removesuffix(".py").replace("/", ".")), func)
    signature = inspect.signature(getattr(fn, "fn", fn))     # a Prefect flow wraps the function
    hints = typing.get_type_hints(getattr(fn, "fn", fn))
    for key, value in others.items():
        if key not in signature.parameters:
            raise ConfigError(f"{where}: flow {func} has no parameter {key!r} (it has {', '.join(signature.parameters)})")
        try:
            pydantic.TypeAdapter(hints.get(key, typing.Any)).validate_python(value)
        except pydantic.ValidationError as e:
            raise ConfigError(f"{where}: parameter {key}: {e.errors()[0]['msg']} (got {value!r})") from None


def resolve(spec: dict, root: Path = ROOT, names: list[str] | None = None, check: bool = True,
            overrides: list[str] | None = None, workdir: Path | None = None) -> tuple[dict, list[str], list[str]]:
    """The prefect.yaml Prefect can use: (resolved spec, deployments kept, messages about skipped ones).
    `overrides`: `DEPLOYMENT.KEY=VALUE` items put on top of that deployment's config (`quipu deploy
    --set`); `root`: the flow runs' working directory (`$QUIPU_ROOT`, default this checkout)."""
    spec = copy.deepcopy(spec)
    configs = (spec.pop("quipu", None) or {}).get("configs", {}) or {}
    by_deployment = split_overrides(overrides, [d.get("name") for d in spec.get("deployments", []) or []])
    kept, skipped, deployments = [], [], []
    for dep in spec.get("deployments", []) or []:
        name = dep.get("name")
        if names and name not in names:
            continue
        entry = dep.get("entrypoint", "")
        if not (root / entry.split(":")[0]).is_file():
            skipped.append(f"{name}: entrypoint {entry} not found (flow not written yet?), skipped")
            continue
        base = {}
        if name in configs:
            path = root / configs[name]
            if not path.is_file():
                raise ConfigError(f"deployment {name}: config file {configs[name]} not found (quipu.configs.{name} "
                                  f"in the prefect.yaml)")
            try:
                base = read_yaml(path)
            except ConfigError as e:
                raise ConfigError(f"deployment {name}: {configs[name]}: {e}") from None
        where = f"deployment {name} ({configs.get(name, 'no config file')})"
        params = dep.setdefault("parameters", {}) or {}
        dep["parameters"] = params
        if entry == CURATE and name in configs:   # a short form naming the file (curate_config.form_schema)
            from quipu.flows.curate_config import CONFIG_FILE
            params["config"] = apply_overrides({CONFIG_FILE: configs[name], **(params.get("config") or {})},
                                               by_deployment.get(name, []))
        elif "config" in params or base or by_deployment.get(name):
            params["config"] = apply_overrides(deep_merge(base, params.get("config") or {}), by_deployment.get(name, []))
        if check:
            _validate(entry, params, where, root)
        for trig in dep.get("triggers", []) or []:
            tparams = trig.get("parameters")
            if tparams:
                if "config" in tparams:
                    tparams["config"] = deep_merge(params.get("config", {}), tparams["config"])
                if check:
                    _validate(entry, {"config": params.get("config", {})} | tparams, f"{where} trigger", root)
        _narrow_train_trigger(dep)
        deployments.append(dep)
        kept.append(name)
    if names:
        missing = set(names) - {d.get("name") for d in spec.get("deployments", [])}
        if missing:
            raise ConfigError(f"no deployment named {', '.join(sorted(missing))} in the prefect.yaml")
        if check:   # the chain is checked whole, also when only some of it is deployed
            resolve({**spec, "quipu": {"configs": configs}}, root, None, check, overrides, workdir)
    elif check:
        errors, warnings = check_chain(deployments, configs, root)
        for w in dict.fromkeys(warnings):
            print(f"WARNING: {w}", file=sys.stderr)
        fail_on(list(dict.fromkeys(errors)))
    spec["deployments"] = deployments
    text = yaml.safe_dump(spec, sort_keys=False).replace(ROOT_PLACEHOLDER, str(workdir or root))
    return yaml.safe_load(text), kept, skipped


def split_overrides(overrides: list[str] | None, names: list[str]) -> dict[str, list[str]]:
    """`DEPLOYMENT.KEY=VALUE` items by deployment: {deployment: ["KEY=VALUE", ...]}."""
    out: dict[str, list[str]] = {}
    for item in overrides or []:
        name, _, rest = item.partition(".")
        if name not in names or not rest:
            raise ConfigError(f"--set {item!r}: expected DEPLOYMENT.KEY=VALUE with DEPLOYMENT one of {', '.join(names)}")
        out.setdefault(name, []).append(rest)
    return out


def work_root() -> Path:
    """Where flow runs execute (the pull step's directory): $QUIPU_ROOT, or this checkout."""
    root = os.environ.get("QUIPU_ROOT")
    return Path(root).expanduser().resolve() if root else ROOT


def _narrow_train_trigger(dep: dict) -> None:
    """A training deployment's trigger on quipu.curate.completed listens only to the datasets its
    blend names: a curate run into any other dataset starts no training run."""
    if dep.get("entrypoint") != TRAIN:
        return
    config = (dep.get("parameters") or {}).get("config") or {}
    blend = {s.get("dataset") for p in (config.get("data") or {}).get("phases") or [] for s in p.get("sources") or []}
    for trig in dep.get("triggers") or []:
        match = trig.get("match") or {}
        if CURATE_COMPLETED in (trig.get("expect") or []) and match.get("prefect.resource.id") == DATASET_RESOURCE + "*":
            trig["match"] = {**match, "prefect.resource.id": train_trigger_resources({b for b in blend if b})}


def ensure_work_pools(spec: dict) -> list[str]:
    """Create the (process) work pools the deployments name, if missing. Returns those created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    created = []
    pools = {(d.get("work_pool") or {}).get("name"): (d.get("work_pool") or {}).get("type", "process")
             for d in spec.get("deployments", [])}
    with get_client(sync_client=True) as client:
        for name, kind in pools.items():
            if not name:
                continue
            try:
                client.read_work_pool(name)
            except ObjectNotFound:
                client.create_work_pool(WorkPoolCreate(name=name, type=kind or "process"))
                created.append(name)
    return created


def api_url() -> str | None:
    from prefect.settings import PREFECT_API_URL
    return PREFECT_API_URL.value() or None


NEXT_STEPS = """next:
  make worker                          a process worker on the pool (another terminal; PREFECT_API_URL as here)
  cp FILES {raw}/{pad}the `watch` deployment looks every 5 minutes and curates what is new
  prefect deployment run watch/watch   look now instead of waiting
  quipu report --latest                the newest curate run's funnel (or the run's Artifacts tab)"""


def describe(dep: dict) -> str:
    """One line per deployment: name, flow, what starts it."""
    starts = []
    for trig in dep.get("triggers") or []:
        match = (trig.get("match") or {}).get("prefect.resource.id")
        shown = ", ".join(match) if isinstance(match, list) else match
        starts.append(f"on {', '.join(trig.get('expect') or [])} ({shown})")
    for sch in dep.get("schedules") or []:
        when = f"every {sch['interval']} s" if "interval" in sch else sch.get("cron", "?")
        starts.append(f"{when}{'' if sch.get('active', True) else ' (off)'}")
    return f"  {dep['name']:<15} {dep.get('entrypoint', ''):<40} {'; '.join(starts) or 'by hand'}"


def deploy(prefect_file: Path = DEFAULT_FILE, names: list[str] | None = None, dry_run: bool = False,
           overrides: list[str] | None = None) -> int:
    from quipu.catalog.errors import UserError

    if not prefect_file.is_file():
        raise UserError(f"deployment file not found: {prefect_file}")
    spec = read_yaml(prefect_file)
    workdir = work_root()
    if workdir != ROOT:
        print(f"WARNING: QUIPU_ROOT={workdir} is not the checkout this quipu is installed from ({ROOT}): flow runs "
              f"load flows/*.py from {workdir} and import the package installed on the worker; install the "
              "project there (make install) on every worker machine", file=sys.stderr)
    resolved, kept, skipped = resolve(spec, ROOT, names, overrides=overrides, workdir=workdir)
    for msg in skipped:
        print(f"skipped {msg}")
    out = db.quipu_home() / "deploy" / "prefect.yaml"
    write_bytes_atomic(out, yaml.safe_dump(resolved, sort_keys=False).encode())
    if dry_run or not kept:
        print(f"checked {len(kept)} deployments together (configs, blends against what curate writes); "
              f"resolved file: {out}")
        for dep in resolved["deployments"]:
            print(describe(dep))
        return 0
    if not api_url():
        raise UserError("PREFECT_API_URL is not set: start a server (`make server`) and export the URL it prints, "
                        "e.g. export PREFECT_API_URL=http://127.0.0.1:4200/api")
    try:
        created = ensure_work_pools(resolved)
    except Exception as e:  # connection refused, 401, ...
        raise UserError(f"cannot reach the Prefect server at {api_url()}: {e}") from None
    for pool in created:
        print(f"created work pool {pool!r}")
    cmd = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--prefect-file", str(out)]
    for name in kept:
        cmd += ["--name", name]
    # Prefect's own output (a table and a `prefect worker start` hint per deployment) goes to the log
    # file; shown only when it fails
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PREFECT_CLI_WRAP_LINES": "false"},
                          capture_output=True, text=True)
    log = out.with_name("prefect-deploy.log")
    write_bytes_atomic(log, (proc.stdout + proc.stderr).encode())
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise UserError(f"prefect deploy failed (exit {proc.returncode}); its last lines:\n{tail}\n(all of it: {log})")
    print(f"deployed to {api_url()} (flow runs work in {workdir}):")
    for dep in resolved["deployments"]:
        print(describe(dep))
    raw = next((loc for d in resolved["deployments"] if d.get("entrypoint") == WATCH
                for loc in ((d.get("parameters") or {}).get("config") or {}).get("locations", [])), "data/raw")
    print(NEXT_STEPS.format(raw=raw.rstrip("/"), pad=" " * max(1, 28 - len(raw.rstrip("/")))))
    return 0
