"""The benchmark registry: evaluation sets declared in YAML, read and checked before any document is.

One YAML file per benchmark (`configs/benchmarks/<name>.yaml`):

    name: gsm8k
    path: ../../data/benchmarks/gsm8k/test.jsonl   # absolute, relative to this YAML, ~ or $VAR,
                                                  # or pkg://<package>/<file inside it>
    fields: [question, answer]                    # the text to protect
    id_field: id                                  # optional; default: <name>/<record number>
    format: jsonl                                 # optional; default: from the suffix

Formats: JSONL, JSON (a list of objects, or an object holding one such list), CSV, parquet; any of
them gzip-compressed (`.gz`). A field's value may be a string, a number or a list of strings (each
element is its own text, e.g. multiple-choice options).

Every problem (unknown name, bad YAML, missing or empty file, a declared field absent from a
record) raises `BenchmarkError` with a message naming the YAML, the file and the field.
"""
from __future__ import annotations

import csv
import gzip
import importlib.util
import io
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quipu.catalog.errors import UserError
from quipu.catalog.files import sha256_file

REGISTRY_DIR = Path(__file__).resolve().parents[1] / "configs" / "benchmarks"
PKG_SCHEME = "pkg://"
FORMATS = ("jsonl", "json", "csv", "parquet")


class BenchmarkError(UserError, ValueError):
    """A benchmark that cannot be used; the message names the YAML, file and field."""


class BenchmarkSpec(BaseModel):
    """One benchmark's registry entry (the YAML file's keys)."""
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="used in removal reasons: contaminated:<name>")
    path: str = Field(min_length=1, description="the evaluation file: path, relative to the YAML, or pkg://<package>/<file>")
    fields: list[str] = Field(min_length=1, description="fields holding the text to protect")
    id_field: str | None = Field(None, description="field with the item id; default: <name>/<record number>")
    format: Literal["jsonl", "json", "csv", "parquet"] | None = Field(None, description="default: from the file suffix")
    description: str | None = None
    source: str | None = Field(None, description="where the file comes from (URL, release), for people reading the registry")


@dataclass(frozen=True)
class BenchmarkItem:
    id: str
    texts: tuple[str, ...]      # one text per field value (list values give several)


@dataclass(frozen=True)
class Benchmark:
    """A loaded benchmark: its spec, where it came from, its fingerprint and items."""
    spec: BenchmarkSpec
    yaml_path: str | None
    file: str
    sha256: str
    bytes: int
    items: tuple[BenchmarkItem, ...]

    @property
    def name(self) -> str:
        return self.spec.name

    def describe(self) -> dict:
        return {"name": self.name, "path": self.file, "sha256": self.sha256, "items": len(self.items),
                "bytes": self.bytes, "fields": list(self.spec.fields), "id_field": self.spec.id_field,
                "spec": self.yaml_path}


# ---- finding and reading specs ----------------------------------------------------------------

def available(registry_dir: str | Path | None = None) -> list[str]:
    d = Path(registry_dir) if registry_dir else REGISTRY_DIR
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def spec_path(ref: str, registry_dir: str | Path | None = None) -> Path:
    """A registry name (`humaneval`) or a YAML path (`my/mmlu.yaml`) to the YAML file."""
    if ref.endswith((".yaml", ".yml")) or "/" in ref or os.sep in ref:
        p = Path(os.path.expandvars(ref)).expanduser()
        if not p.is_file():
            raise BenchmarkError(f"benchmark spec not found: {ref}")
        return p.resolve()
    d = Path(registry_dir) if registry_dir else REGISTRY_DIR
    p = d / f"{ref}.yaml"
    if not p.is_file():
        names = ", ".join(available(d)) or "none"
        raise BenchmarkError(f"unknown benchmark {ref!r}: no {p} (registered: {names}; or give a path to a YAML file)")
    return p.resolve()


def read_spec(path: Path) -> BenchmarkSpec:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise BenchmarkError(f"{path}: not valid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise BenchmarkError(f"{path}: expected a mapping with name, path, fields")
    try:
        return BenchmarkSpec.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or '(top level)'}: "
                             f"{'unknown key' if err['type'] == 'extra_forbidden' else err['msg']}"
                             for err in e.errors())
        raise BenchmarkError(f"{path}: {problems}") from None


def resolve_file(raw: str, base: Path | None) -> Path:
    """The benchmark file a spec's `path` names: pkg://, $VAR, ~, absolute or relative to the YAML."""
    if raw.startswith(PKG_SCHEME):
        rest = raw[len(PKG_SCHEME):]
        package, _, inner = rest.partition("/")
        try:
            found = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            found = None
        if found is None or not found.submodule_search_locations:
            raise BenchmarkError(f"{raw}: Python package {package!r} is not installed")
        return Path(list(found.submodule_search_locations)[0]) / inner
    p = Path(os.path.expandvars(raw)).expanduser()
    if not p.is_absolute() and base is not None:
        p = base / p
    return p.resolve()


def detect_format(path: Path, declared: str | None) -> str:
    if declared:
        return declared
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    ext = suffixes[-1].lstrip(".") if suffixes else ""
    ext = {"ndjson": "jsonl", "pq": "parquet"}.get(ext, ext)
    if ext not in FORMATS:
        raise BenchmarkError(f"{path}: cannot tell the format from the suffix; set `format:` to one of {', '.join(FORMATS)}")
    return ext


# ---- reading records --------------------------------------------------------------------------

def _open_text(path: Path) -> io.TextIOBase:
    if path.suffix.lower() == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def read_records(path: Path, fmt: str) -> list[dict]:
    """All records of a benchmark file as dicts (benchmarks are small: thousands of items)."""
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq
            return pq.read_table(path).to_pylist()
        with _open_text(path) as fh:
            if fmt == "jsonl":
                out = []
                for i, line in enumerate(fh, 1):
                    if line.strip():
                        try:
                            out.append(json.loads(line))
                        except json.JSONDecodeError as e:
                            raise BenchmarkError(f"{path}: line {i} is not valid JSON ({e.msg})") from None
                return out
            if fmt == "csv":
                return list(csv.DictReader(fh))
            data = json.load(fh)
    except BenchmarkError:
        raise
    except (OSError, UnicodeDecodeError, EOFError, ValueError) as e:
        raise BenchmarkError(f"{path}: cannot read as {fmt}: {e}") from None
    if isinstance(data, dict):  # e.g. {"data": [...]}: the one list of objects inside
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise BenchmarkError(f"{path}: expected a JSON list of objects, or an object holding exactly one such list")
        data = lists[0]
    if not isinstance(data, list):
        raise BenchmarkError(f"{path}: expected a JSON list of objects")
    return data


def _texts(value, path: Path, field: str, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [str(value)]
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) or v is None for v in value):
        return [str(v) for v in value if v is not None]
    raise BenchmarkError(f"{path}: field {field!r} of {where} is a {type(value).__name__}; "
                         f"expected text, a number or a list of texts")


def load_items(spec: BenchmarkSpec, file: Path, label: str) -> tuple[BenchmarkItem, ...]:
    """Items of one benchmark, checking that every record has every declared field."""
    if not file.is_file():
        raise BenchmarkError(f"{label}: benchmark file not found: {file}")
    if file.stat().st_size == 0:
        raise BenchmarkError(f"{label}: benchmark file is empty: {file}")
    fmt = detect_format(file, spec.format)
    records = read_records(file, fmt)
    if not records:
        raise BenchmarkError(f"{label}: benchmark file has no records: {file}")
    items = []
    seen: set[str] = set()
    wanted = list(spec.fields) + ([spec.id_field] if spec.id_field else [])
    for i, rec in enumerate(records):
        where = f"record {i + 1}"
        if not isinstance(rec, dict):
            raise BenchmarkError(f"{label}: {file}: {where} is not an object")
        for field in wanted:
            if field not in rec:
                have = ", ".join(sorted(map(str, rec))) or "none"
                raise BenchmarkError(f"{label}: {file}: field {field!r} is missing from {where} (fields there: {have})")
        item_id = str(rec[spec.id_field]) if spec.id_field else f"{spec.name}/{i}"
        if item_id in seen:
            raise BenchmarkError(f"{label}: {file}: duplicate id {item_id!r} in field {spec.id_field!r} ({where})")
        seen.add(item_id)
        texts = [t for f in spec.fields for t in _texts(rec[f], file, f, where)]
        items.append(BenchmarkItem(item_id, tuple(texts)))
    return tuple(items)


@lru_cache(maxsize=64)
def _load_cached(yaml_path: str | None, spec_json: str, file: str, size: int, mtime_ns: int) -> Benchmark:
    spec = BenchmarkSpec.model_validate_json(spec_json)
    label = f"benchmark {spec.name!r} ({yaml_path})" if yaml_path else f"benchmark {spec.name!r}"
    items = load_items(spec, Path(file), label)
    return Benchmark(spec=spec, yaml_path=yaml_path, file=file, sha256=sha256_file(file), bytes=size, items=items)


def load_benchmark(spec: BenchmarkSpec, yaml_path: Path | None = None) -> Benchmark:
    """Read and check one benchmark; cached per process by (file, size, mtime)."""
    file = resolve_file(spec.path, yaml_path.parent if yaml_path else None)
    label = f"benchmark {spec.name!r} ({yaml_path})" if yaml_path else f"benchmark {spec.name!r}"
    if not file.is_file():
        raise BenchmarkError(f"{label}: benchmark file not found: {file}")
    st = file.stat()
    return _load_cached(str(yaml_path) if yaml_path else None, spec.model_dump_json(), str(file), st.st_size, st.st_mtime_ns)


def load_benchmarks(refs: list[str], registry_dir: str | Path | None = None) -> list[Benchmark]:
    """Registry names or YAML paths to loaded, checked benchmarks (names must be unique)."""
    out: list[Benchmark] = []
    names: dict[str, str] = {}
    for ref in refs:
        path = spec_path(ref, registry_dir)
        bench = load_benchmark(read_spec(path), path)
        if bench.name in names:
            raise BenchmarkError(f"benchmark name {bench.name!r} is declared twice ({names[bench.name]} and {path})")
        names[bench.name] = str(path)
        out.append(bench)
    return out
