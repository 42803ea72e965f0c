"""Where training and evaluation text comes from: one reader for every model quipu trains or measures.

A `TextSource` is a glob of JSONL/parquet files (or a directory, e.g. an earlier curate run's
`heuristics/removed`), or a catalog dataset, optionally filtered by field values or removal
reasons. Classifier training (quipu.trainer.classifier_train), distillation and KenLM (`quipu ppl`,
`quipu kenlm`), held-out bits per byte (quipu.trainer.bpb) and the ablation's mix all read through
here, with the curation's own readers (quipu.tasks.reading): the same files give the same
documents, in file order, whichever model reads them.

A document is a dict: `id`, `text`, `lang` (the source's `lang`, else the record's, else `und`),
`source` (the record's `source` field, if any). Records that cannot be read (malformed lines,
too-large records, no text) are counted, never trained on.
"""
from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from quipu.catalog import registry
from quipu.catalog.errors import UserError


class SourceError(UserError, ValueError):
    """A source that matches nothing or cannot be read; names it."""


class TextSource(BaseModel):
    """Documents of one origin. A plain string where a config expects a source is its `path`."""
    model_config = ConfigDict(extra="forbid")
    path: str | None = Field(None, description="glob of .jsonl[.gz|.zst]/.parquet files, or a directory "
                                               "(e.g. runs/x/heuristics/removed)")
    dataset: str | None = Field(None, description="catalog dataset name or id")
    where: dict[str, str | list[str]] = Field(default_factory=dict,
                                              description="keep records whose field (or metadata key) is one of these values")
    reasons: list[str] = Field(default_factory=list, description="keep removed rows whose `reason` starts with one of these")
    lang: str | None = Field(None, description="language of every record (default: the record's `lang` field)")
    limit: int | None = Field(None, gt=0, description="at most this many records (the first, in file order)")
    name: str | None = Field(None, description="its name in reports (default: file or dataset name plus the filter values)")

    @model_validator(mode="after")
    def _one_origin(self):
        if (self.path is None) == (self.dataset is None):
            raise ValueError("give exactly one of `path` or `dataset`")
        return self

    def describe(self) -> str:
        what = self.path or f"dataset:{self.dataset}"
        if self.where:
            what += " where " + ",".join(f"{k}={v}" for k, v in sorted(self.where.items()))
        if self.reasons:
            what += " reasons " + ",".join(self.reasons)
        return what

    def label(self) -> str:
        """A short name for reports: `name`, else the file or dataset name and the filter values."""
        base = Path(self.path).name.split(".")[0] if self.path else str(self.dataset)
        values = [x for v in self.where.values() for x in (v if isinstance(v, list) else [v])]
        return self.name or "-".join([base, *map(str, values)])


def source_files(src: TextSource, dataset_kind: str | None = None) -> list[str]:
    """The files of a source, sorted; a source that names nothing raises `SourceError` naming it."""
    from quipu.tasks.reading import expand_inputs
    if src.dataset is not None:
        ds = registry.get_dataset(src.dataset, kind=dataset_kind)
        if ds is None:
            kind = f"{dataset_kind} " if dataset_kind else ""
            raise SourceError(f"source dataset {src.dataset!r}: no {kind}dataset of that name or id in the catalog")
        return [s["path"] for s in sorted(ds["shards"], key=lambda s: s["path"])]
    try:
        return expand_inputs([src.path])
    except FileNotFoundError:
        raise SourceError(f"source {src.path!r} matches no file") from None


def field_value(meta: dict, key: str):
    """A record's field: a top-level key, else a key of the JSON `metadata` string a curate run's
    parquet keeps its input fields in."""
    if key in meta:
        return meta[key]
    inner = meta.get("metadata")
    if isinstance(inner, str) and inner.startswith("{"):
        try:
            return json.loads(inner).get(key)
        except ValueError:
            return None
    return None


def iter_documents(files: list[str], counts: dict | None = None, lang: str | None = None):
    """(document, record metadata) of every readable text record of `files`, in file order. HTML
    pages and PDFs (of WARC/ARC and .pdf files) are extraction's work, not read here: counted as
    `not_extracted`."""
    from quipu.tasks.reading import RawRecord, ReadStats, read
    for path in files:
        for rec in read(path, ReadStats()):
            if not isinstance(rec, RawRecord) or rec.text is None or rec.reject:
                if counts is not None:
                    payload = isinstance(rec, RawRecord) and rec.kind != "text"
                    why = "not_extracted" if payload else "unreadable"
                    counts[why] = counts.get(why, 0) + 1
                continue
            meta = rec.metadata
            yield {"id": rec.id, "text": rec.text, "lang": lang or str(field_value(meta, "lang") or "und"),
                   "source": meta.get("source")}, meta


def read_source(src: TextSource, counts: dict | None = None, dataset_kind: str | None = None) -> list[dict]:
    """The documents of one source that pass its filters, in file order (at most `limit`)."""
    wanted = {k: {str(x) for x in (v if isinstance(v, list) else [v])} for k, v in src.where.items()}
    out: list[dict] = []
    for doc, meta in iter_documents(source_files(src, dataset_kind), counts, src.lang):
        if any(str(field_value(meta, k)) not in vals for k, vals in wanted.items()):
            continue
        if src.reasons and not str(field_value(meta, "reason") or "").startswith(tuple(src.reasons)):
            continue
        out.append(doc)
        if src.limit and len(out) >= src.limit:
            break
    if not out:
        raise SourceError(f"source {src.describe()} yielded no documents")
    return out


def read_documents(patterns: list[str], languages: list[str] | None = None, min_chars: int = 1,
                   counts: dict | None = None) -> list[dict]:
    """Every document of the files the globs match (sorted, each file once) with at least `min_chars`
    characters, of `languages` (None: any); records not read are counted in `counts`."""
    from quipu.tasks.reading import expand_inputs
    try:
        files = expand_inputs(patterns)
    except FileNotFoundError as e:
        raise SourceError(str(e)) from None
    return [d for d, _ in iter_documents(files, counts)
            if d["text"] and len(d["text"]) >= min_chars and (not languages or d["lang"] in languages)]
