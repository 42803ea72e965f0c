"""Per-domain statistics of a stage: which sites (registered domains) and top-level domains its
kept and removed documents come from, for `<stage>/report.json` (key `domains`).

Counted from files, so it needs nothing from the stages: the `url` column of the stage's input
shards once, then of each stage's removed shards; what a stage keeps is what reached it minus what
it removed. So consecutive stages (a fused segment, whose middle stages write no kept files) count
their input once: `StageDomains(input shards)`, then `.after(results)` per stage, in order.

Hosts are extracted and counted in Arrow per shard; only distinct hosts go through the
public-suffix lookup (cached across stages). Memory is bounded: when more than `MAX_TRACKED`
domains are being counted, the least frequent half is dropped (lossy counting) and the report says
its counts are `exact: false`, each possibly off by at most `max_error`.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from quipu.tasks.urls import host_domain

TOP = 20
MAX_TRACKED = 200_000
# scheme, user info, then the host (the same host `urls.host_of` finds, before the port)
HOST = r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*://)?(?:[^@/?#]*@)?(?P<host>[^/:?#]*)"
NO_DOMAIN = ""          # the key documents without a URL or a registrable host are counted under


def count_urls(urls: pa.Array | pa.ChunkedArray, domains: Counter, tlds: Counter) -> None:
    """Add documents per registered domain and per TLD (NO_DOMAIN: no URL, or no public suffix)."""
    hosts = pc.utf8_lower(pc.struct_field(pc.extract_regex(urls, HOST), [0]))
    for item in pc.value_counts(hosts.fill_null("")).to_pylist():
        domain, tld = host_domain(item["values"])
        n = int(item["counts"])
        domains[domain or NO_DOMAIN] += n
        if tld:
            tlds[tld] += n


def prune(counts: Counter, max_tracked: int) -> int:
    """Drop the rarest half when more than `max_tracked` keys are counted; returns the largest
    count dropped (0 when nothing was): every count is then off by at most that much."""
    if len(counts) <= max_tracked:
        return 0
    ranked = counts.most_common()
    keep = max_tracked // 2
    dropped = ranked[keep][1]
    counts.clear()
    counts.update(dict(ranked[:keep]))
    return dropped


def count_shards(paths: Iterable[str], max_tracked: int = MAX_TRACKED) -> tuple[Counter, Counter, int, int]:
    """(documents per domain, per TLD, documents, max error) of parquet shards (no `url` column:
    no domain); memory stays bounded by `max_tracked` domains."""
    domains, tlds, docs, error = Counter(), Counter(), 0, 0
    for path in paths:
        if not Path(path).exists():
            continue
        meta = pq.ParquetFile(path)
        docs += meta.metadata.num_rows
        if "url" in meta.schema_arrow.names:
            count_urls(pq.read_table(path, columns=["url"]).column("url"), domains, tlds)
        else:
            domains[NO_DOMAIN] += meta.metadata.num_rows
        error = max(error, prune(domains, max_tracked))
    return domains, tlds, docs, error


class StageDomains:
    """Documents per domain still in the pipeline, stage after stage."""

    def __init__(self, input_paths: Iterable[str], max_tracked: int = MAX_TRACKED):
        self.max_tracked = max_tracked
        self.domains, self.tlds, self.docs, self.max_error = count_shards(input_paths, max_tracked)

    def after(self, results: Iterable, top: int = TOP) -> dict:
        """The `domains` block of the next stage's report from its shard results (their removed
        shards); what it kept stays counted for the stage after it."""
        removed_d, removed_t, removed_docs, error = count_shards((r.removed.path for r in results), self.max_tracked)
        self.max_error += error
        self.domains.subtract(removed_d)
        self.tlds.subtract(removed_t)
        self.docs -= removed_docs
        kept_d = {k: max(0, v) for k, v in self.domains.items()}
        report = {"kept_docs": self.docs, "removed_docs": removed_docs,
                  "no_domain": {"kept": kept_d.get(NO_DOMAIN, 0), "removed": removed_d.get(NO_DOMAIN, 0)},
                  "distinct_domains": sum(1 for k, v in kept_d.items() if k != NO_DOMAIN and v)
                  + sum(1 for k, v in removed_d.items() if k != NO_DOMAIN and v and not kept_d.get(k)),
                  "distinct_tlds": len({k for k, v in self.tlds.items() if v > 0} | set(removed_t)),
                  "top_domains_kept": _ranked(kept_d, removed_d, 0, "domain", top),
                  "top_domains_removed": _ranked(kept_d, removed_d, 1, "domain", top),
                  "top_tlds_kept": _ranked(dict(self.tlds), removed_t, 0, "tld", top),
                  "top_tlds_removed": _ranked(dict(self.tlds), removed_t, 1, "tld", top),
                  "exact": self.max_error == 0, "max_error": self.max_error}
        self.domains = Counter({k: v for k, v in kept_d.items() if v})
        self.tlds = Counter({k: v for k, v in self.tlds.items() if v > 0})
        return report


def _ranked(kept: dict, removed: dict, which: int, label: str, top: int) -> list[dict]:
    rows = [(k, max(0, kept.get(k, 0)), removed.get(k, 0)) for k in set(kept) | set(removed) if k != NO_DOMAIN]
    rows = sorted((r for r in rows if r[1 + which]), key=lambda r: (-r[1 + which], r[0]))[:top]
    return [{label: k, "kept": a, "removed": b, "removed_fraction": round(b / (a + b), 4)} for k, a, b in rows]


def domain_markdown(domains: dict, top: int = 10) -> str:
    """The `domains` block as markdown tables (the stage's Prefect artifact)."""
    lines = ["## Domains", "", f"{domains['distinct_domains']:,} registered domains, {domains['distinct_tlds']:,} TLDs"
             + ("" if domains.get("exact", True) else f" (counts off by at most {domains['max_error']:,})"), ""]
    for title, key, label in (("removed", "top_domains_removed", "domain"), ("kept", "top_domains_kept", "domain"),
                              ("removed", "top_tlds_removed", "tld"), ("kept", "top_tlds_kept", "tld")):
        rows = domains.get(key, [])[:top]
        if not rows:
            continue
        lines += [f"**top {label}s by documents {title}**", "", f"| {label} | kept | removed | removed % |", "|---|---:|---:|---:|"]
        lines += [f"| {r[label]} | {r['kept']:,} | {r['removed']:,} | {100 * r['removed_fraction']:.1f} |" for r in rows]
        lines.append("")
    return "\n".join(lines)
