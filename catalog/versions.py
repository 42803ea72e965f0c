"""Dataset versions: which versions a blend source means, and the catalog's table of them.

A curated dataset is the union of its versions (one per curate run into its name, registered by
`registry.register_dataset`). A training source names the dataset (every version, the default),
one version (`versions: 3`) or a range (`versions: "2..4"`, open ends `"3.."` and `"..2"`).
"""
from __future__ import annotations

import json
import re

from quipu.catalog import registry

RANGE = re.compile(r"^\s*(\d*)\s*\.\.\s*(\d*)\s*$")


def parse_versions(spec: int | str | None) -> tuple[int | None, int | None]:
    """(lowest, highest) version, inclusive; None is an open end. Raises ValueError on a bad spec."""
    if spec is None:
        return None, None
    if isinstance(spec, bool):
        raise ValueError("versions: give a version number or a range such as '2..4'")
    if isinstance(spec, int) or (isinstance(spec, str) and spec.strip().isdigit()):
        v = int(spec)
        if v < 1:
            raise ValueError(f"versions: {spec!r}: versions start at 1")
        return v, v
    m = RANGE.match(str(spec))
    if not m or not (m.group(1) or m.group(2)):
        raise ValueError(f"versions: {spec!r} is not a version (3) or a range ('2..4', '3..', '..2')")
    lo, hi = (int(g) if g else None for g in m.groups())
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"versions: {spec!r}: the range is empty ({lo} > {hi})")
    return lo, hi


def select_versions(name: str, spec: int | str | None, kind: str = "curated") -> list[dict]:
    """The catalog rows (with shards) of the versions `spec` selects, oldest first; [] when none."""
    lo, hi = parse_versions(spec)
    return [v for v in registry.dataset_versions(name, kind)
            if (lo is None or v["version"] >= lo) and (hi is None or v["version"] <= hi)]


def format_datasets(kind: str | None = None) -> str:
    """`quipu catalog ls datasets`: one line per dataset and, under a versioned one, one per version
    with its documents and tokens (counted when curated) and the run that added it."""
    lines = []
    groups: dict[tuple[str, str], list[dict]] = {}
    for d in registry.list_datasets(kind=kind):
        groups.setdefault((d["name"], d["kind"]), []).append(d)
    for (name, dkind), rows in sorted(groups.items()):
        rows.sort(key=lambda r: (r.get("version") or 0, r["created"]))
        docs = sum(r["rows"] or 0 for r in rows)
        tokens = [json.loads(r["info"] or "{}").get("tokens") for r in rows]
        tok = f"{sum(tokens):,}" if tokens and all(t is not None for t in tokens) else "-"
        lines.append(f"  {name:<32} {dkind:<12} versions={len(rows):<3} docs={docs:<10,} tokens={tok:<13} "
                     f"bytes={sum(r['bytes'] or 0 for r in rows):,}")
        if dkind != "curated":
            continue
        for r, t in zip(rows, tokens):
            lines.append(f"    v{r.get('version') or '?':<4} docs={r['rows'] or 0:<10,} tokens={'-' if t is None else format(t, ','):<13} "
                         f"{r['created']:%Y-%m-%d %H:%M}  run={r['run_id'] or '-'}  {r['path']}")
    return "\n".join(lines)


def version_lineage(name: str, kind: str = "curated") -> list[dict]:
    """Every version of a dataset with the run that added it and that run's inputs (`catalog show`)."""
    out = []
    for v in registry.dataset_versions(name, kind):
        inputs = [r["path"] for r in registry.get_lineage(v["run_id"]) if r["direction"] == "input"] if v["run_id"] else []
        out.append({"version": v["version"], "documents": v["rows"], "tokens": json.loads(v["info"] or "{}").get("tokens"),
                    "created": v["created"], "run_id": v["run_id"], "path": v["path"], "inputs": inputs,
                    "shards": [s["path"] for s in v["shards"]]})
    return out
