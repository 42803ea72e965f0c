"""Where a scoring model is: one resolver for every stage and flow.

A model reference in a config is a path (file or directory), a catalog name or id, or None for the
newest model of its kind registered in the catalog. Kinds: the fastText classifiers
(`<what>-fasttext`, quipu.scoring.fasttext_classifier; the quality classifier is `quality-fasttext`),
the Wayra student (`wayra`, quipu.scoring.wayra), KenLM (`kenlm`, quipu.scoring.kenlm_model).
"""
from __future__ import annotations

import json
import os

from quipu.catalog.errors import UserError

QUALITY_KIND = "quality-fasttext"
STUDENT_KIND = "wayra"
KENLM_KIND = "kenlm"

HOW_TO_TRAIN = {QUALITY_KIND: "quipu quality train CONFIG", STUDENT_KIND: "quipu ppl distill CONFIG",
                KENLM_KIND: "quipu kenlm train CONFIG"}


def how_to_train(kind: str) -> str:
    """The command that trains a model of `kind`: every `*-fasttext` kind is a classifier of the family."""
    if kind in HOW_TO_TRAIN:
        return HOW_TO_TRAIN[kind]
    return f"quipu quality train CONFIG --set kind={kind}" if kind.endswith("-fasttext") else "quipu"


class ModelNotFound(UserError, ValueError):
    """A model reference that names no file and no model of its kind in the catalog."""


def declared_kinds(path: str) -> set[str]:
    """The kinds a model file or folder says it is: the catalog's rows for it, and the `kind` of its
    sidecar (`<model>.json` of a fastText classifier; `config.json` of a student folder)."""
    from quipu.catalog import registry
    kinds = registry.model_kinds_at(path)
    sidecar = os.path.join(path, "config.json") if os.path.isdir(path) else os.path.splitext(path)[0] + ".json"
    try:
        if os.path.isfile(sidecar) and os.path.getsize(sidecar) < (1 << 20):
            declared = json.loads(open(sidecar, "rb").read()).get("kind")
            if isinstance(declared, str):
                kinds.add(declared)
    except (OSError, ValueError, AttributeError):
        pass       # an unreadable sidecar is its loader's to report
    return kinds


def looks_like_path(ref: str, suffixes: tuple[str, ...] = ()) -> bool:
    return os.path.exists(os.path.expanduser(ref)) or os.sep in ref or (bool(suffixes) and ref.endswith(suffixes))


def resolve_model(kind: str, ref: str | None, key: str, suffixes: tuple[str, ...] = ()) -> str:
    """The path of the model `ref` names. `key` is the config key, for the error message."""
    from quipu.catalog import registry
    if ref and looks_like_path(ref, suffixes):
        path = os.path.abspath(os.path.expanduser(ref))
        registry.verify_model_files(path)   # a model quipu wrote: as it was written
        other = declared_kinds(path) - {kind}
        if other:     # e.g. news.model pointed at the quality classifier: it would score the wrong thing
            raise ModelNotFound(f"{key}: {ref!r} is a `{sorted(other)[0]}` model, not a `{kind}` model")
        return path
    row = registry.get_model(ref, kind)
    if row is not None:
        registry.verify_model_files(row["path"])
        return row["path"]
    if ref:
        raise ModelNotFound(f"{key}: {ref!r} is neither a file nor a `{kind}` model in the catalog")
    raise ModelNotFound(f"{key}: no `{kind}` model is registered in the catalog; train one with "
                        f"`{how_to_train(kind)}` or set {key} to a path")
