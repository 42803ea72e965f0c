"""Where a scoring model is: one resolver for every stage and flow.

A model reference in a config is a path (file or directory), a catalog name or id, or None for the
newest model of its kind registered in the catalog. Kinds: the fastText classifiers
(`<what>-fasttext`, quipu.trainer.fasttext_classifier; the quality classifier is `quality-fasttext`),
the Wayra student (`wayra`, quipu.trainer.wayra), KenLM (`kenlm`, quipu.trainer.kenlm_model).
"""
from __future__ import annotations

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


def looks_like_path(ref: str, suffixes: tuple[str, ...] = ()) -> bool:
    return os.path.exists(os.path.expanduser(ref)) or os.sep in ref or (bool(suffixes) and ref.endswith(suffixes))


def resolve_model(kind: str, ref: str | None, key: str, suffixes: tuple[str, ...] = ()) -> str:
    """The path of the model `ref` names. `key` is the config key, for the error message."""
    from quipu.catalog import registry
    if ref and looks_like_path(ref, suffixes):
        path = os.path.abspath(os.path.expanduser(ref))
        registry.verify_model_files(path)   # a model quipu wrote: as it was written
        return path
    row = registry.get_model(ref, kind)
    if row is not None:
        registry.verify_model_files(row["path"])
        return row["path"]
    if ref:
        raise ModelNotFound(f"{key}: {ref!r} is neither a file nor a `{kind}` model in the catalog")
    raise ModelNotFound(f"{key}: no `{kind}` model is registered in the catalog; train one with "
                        f"`{how_to_train(kind)}` or set {key} to a path")
