"""Per-domain statistics of a stage: which sites (registered domains) and top-level domains its
kept and removed documents come from, for `<stage>/report.json` (key `domains`).

Read from the stage's output shards after they are written (only the `url` column), so it needs
nothing from the stage itself. Hosts are extracted and counted in Arrow per shard; only the
distinct hosts go through the public-suffix lookup. Memory is bounded: when more than
`MAX_TRACKED` domains are being counted, the least frequent half is dropped (lossy counting) and
the report says its counts are `exact: false`, each possibly low by at most `max_error`.
"""
from __future__ import annotations

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


class DomainCounter:
    """Documents per (registered domain, top-level domain), kept and removed."""

    def __init__(self, max_tracked: int = MAX_TRACKED):
        self.max_tracked = max_tracked
        self.domains: dict[str, list[int]] = {}     # domain -> [kept, removed]
        self.tlds: dict[str, list[int]] = {}
        self.docs = [0, 0]
        self.no_domain = [0, 0]
        self.max_error = 0

    def add_urls(self, urls: pa.ChunkedArray | pa.Array, which: int) -> None:
        """Count one column of URLs as kept (which=0) or removed (which=1)."""
        self.docs[which] += len(urls)
        hosts = pc.utf8_lower(pc.struct_field(pc.extract_regex(urls, HOST), [0]))
        for item in pc.value_counts(hosts.fill_null("")).to_pylist():
            domain, tld = host_domain(item["values"])
            n = int(item["counts"])
            if domain is None:
                self.no_domain[which] += n
                continue
            self.domains.setdefault(domain, [0, 0])[which] += n
            if tld:
                self.tlds.setdefault(tld, [0, 0])[which] += n
        if len(self.domains) > self.max_tracked:
            self._prune()

    def _prune(self) -> None:
        ranked = sorted(self.domains.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))
        keep = self.max_tracked // 2
        self.max_error = max(self.max_error, max(sum(v) for _, v in ranked[keep:]))
        self.domains = dict(ranked[:keep])

    def add_shard(self, path: str | Path, which: int) -> None:
        if not Path(path).exists() or "url" not in pq.read_schema(path).names:
            return
        self.add_urls(pq.read_table(path, columns=["url"]).column("url"), which)

    def report(self, top: int = TOP) -> dict:
        def ranked(counts: dict[str, list[int]], which: int, label: str) -> list[dict]:
            rows = sorted((kv for kv in counts.items() if kv[1][which]), key=lambda kv: (-kv[1][which], kv[0]))[:top]
            return [{label: k, "kept": v[0], "removed": v[1], "removed_fraction": round(v[1] / (v[0] + v[1]), 4)}
                    for k, v in rows]
        return {"kept_docs": self.docs[0], "removed_docs": self.docs[1],
                "no_domain": {"kept": self.no_domain[0], "removed": self.no_domain[1]},
                "distinct_domains": len(self.domains), "distinct_tlds": len(self.tlds),
                "top_domains_kept": ranked(self.domains, 0, "domain"),
                "top_domains_removed": ranked(self.domains, 1, "domain"),
                "top_tlds_kept": ranked(self.tlds, 0, "tld"),
                "top_tlds_removed": ranked(self.tlds, 1, "tld"),
                "exact": self.max_error == 0, "max_error": self.max_error}


def domain_report(results: Iterable, top: int = TOP) -> dict:
    """The `domains` block of a stage report from its shard results (kept and removed shards)."""
    counter = DomainCounter()
    for r in results:
        counter.add_shard(r.kept.path, 0)
        counter.add_shard(r.removed.path, 1)
    return counter.report(top)


def domain_markdown(domains: dict, top: int = 10) -> str:
    """The `domains` block as markdown tables (the stage's Prefect artifact)."""
    lines = ["## Domains", "", f"{domains['distinct_domains']:,} registered domains, {domains['distinct_tlds']:,} TLDs"
             + ("" if domains.get("exact", True) else f" (counts low by at most {domains['max_error']:,})"), ""]
    for title, key, label in (("removed", "top_domains_removed", "domain"), ("kept", "top_domains_kept", "domain"),
                              ("removed", "top_tlds_removed", "tld"), ("kept", "top_tlds_kept", "tld")):
        rows = domains.get(key, [])[:top]
        if not rows:
            continue
        lines += [f"**top {label}s by documents {title}**", "", f"| {label} | kept | removed | removed % |", "|---|---:|---:|---:|"]
        lines += [f"| {r[label]} | {r['kept']:,} | {r['removed']:,} | {100 * r['removed_fraction']:.1f} |" for r in rows]
        lines.append("")
    return "\n".join(lines)
