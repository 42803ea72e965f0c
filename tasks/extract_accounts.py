"""Extract's accounting under the stage contract: what a work unit gives (`ExtractResult`, a
`ShardResult` with the unit's input files, quarantine and several kept shards), the tally that
writes and counts it while the unit is read (`UnitTally`, a `driver.Tally` as every stage's), and
the stage report summed from the units (`aggregate_extract`: `driver.aggregate` plus records read,
quarantine and each input file's account, all checked).

Every record read is a document or quarantined; every document is kept or removed with a reason.
A removed/ shard also holds a row for each page a PDF dropped (kept document or removed): reason
`pdf:<why>` (as in the report's `stats.pdf.pages_dropped`), id `<document id>#page=<n>` (the pages
past `max_pages`: one row, `#pages=<a>-<b>`), no text, the page(s) and any detail in `metadata`.
They are counted apart (`removed_page_rows`), never as documents: input = kept + removed documents.
"""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
from pydantic import BaseModel

from quipu.tasks.driver import Tally, aggregate
from quipu.tasks.schema import BASE_SCHEMA, QUARANTINE_SCHEMA, TEXT_BYTES, conform
from quipu.tasks.stage import Shard, ShardResult, ShardWriter, StageLayout

STAGE = "extract"
# extract's removed rows before they are put in the run's removed-rows schema
REMOVED_FIELDS = BASE_SCHEMA.append(pa.field("reason", pa.string(), nullable=False)).append(TEXT_BYTES)


class FileAccount(BaseModel):
    """What one input file (or part of one) of a unit gave: every record read is a document or
    quarantined."""
    source: str
    part: str | None = None      # "bytes A-B" / "row groups A-B" when the unit is part of a large file
    input_sha256: str
    records_read: int
    documents: int
    kept: int
    quarantined: int
    quarantine_by_reason: dict[str, int]
    skipped_records: dict[str, int]


class ExtractResult(ShardResult):
    """One work unit's extraction (one input file, or several small ones packed): a stage's shard
    result whose input is files, not a shard, with its kept shards (several for a large unit), its
    quarantined records and the account of each input file. Also its done-marker
    (`extract/_shards/<unit key>.json`)."""
    input: None = None                  # extract reads input files (`files`), not a shard
    kept: None = None                   # its kept rows are `kept_shards`
    source: str                         # the unit's first input file (its only one unless packed)
    input_sha256: str
    files: list[FileAccount]
    records_read: int
    quarantined: int
    quarantine_by_reason: dict[str, int]
    skipped_records: dict[str, int]     # records that are not documents (warcinfo, request), by type
    kept_shards: list[Shard]
    quarantine: Shard | None
    removed_page_rows: int = 0          # rows of `removed` that are a PDF's dropped pages, not documents

    def outputs(self) -> list[Shard]:
        return [*self.kept_shards, self.removed, *([self.quarantine] if self.quarantine else [])]


class UnitTally(Tally):
    """Where one unit's documents go, with the counts of its result: kept rows into rolling shards of
    about `shard_bytes`, removed rows into one shard, both written in
    batches of `batch_rows`."""

    def __init__(self, layout: StageLayout, key: str, batch_rows: int, shard_bytes: int, removed_schema: pa.Schema):
        super().__init__()
        self.layout, self.key, self.batch_rows, self.shard_bytes = layout, key, batch_rows, shard_bytes
        self.kept_shards: list[Shard] = []
        self.kept_w: ShardWriter | None = None
        self.kept_bytes = 0
        self.removed_schema = removed_schema
        self.removed_w = ShardWriter(layout.removed / f"{key}.parquet", removed_schema)
        self.kept_rows: list[dict] = []
        self.removed_rows: list[dict] = []
        self.page_rows: list[dict] = []
        self.removed_page_rows = 0

    def add(self, row: dict, reason: str | None, nbytes: int) -> None:
        self.n_in += 1
        self.bytes_in += nbytes
        self.chars_in += len(row["text"])
        if reason is None:
            self.n_kept += 1
            self.kept_rows.append(row)
            self.kept_bytes += nbytes
            self.bytes_out += nbytes
            self.chars_out += len(row["text"])
        else:
            row["reason"] = reason
            row["text_bytes"] = nbytes
            self.removed_rows.append(row)
        self._flush_if_full()

    def add_page(self, row: dict) -> None:
        """A page a PDF dropped (`page_row`): written with the removed rows, counted apart."""
        self.page_rows.append(row)
        self.removed_page_rows += 1
        self._flush_if_full()

    def _flush_if_full(self) -> None:
        if len(self.kept_rows) + len(self.removed_rows) + len(self.page_rows) >= self.batch_rows \
                or self.kept_bytes >= self.shard_bytes:
            self.flush()

    def flush(self, final: bool = False) -> None:
        if self.kept_rows:
            if self.kept_w is None:
                self.kept_w = ShardWriter(self.layout.kept / f"{self.key}-{len(self.kept_shards):04d}.parquet", BASE_SCHEMA)
            self.kept_w.write(pa.Table.from_pylist(self.kept_rows, BASE_SCHEMA))
            self.kept_rows = []
        if self.removed_rows or self.page_rows:
            table = conform(pa.Table.from_pylist(self.removed_rows, REMOVED_FIELDS), self.removed_schema, STAGE)
            self.count_removed(table)     # documents only: a page's reason is no document's
            if self.page_rows:
                pages = pa.Table.from_pylist(self.page_rows, REMOVED_FIELDS)
                table = pa.concat_tables([table, conform(pages, self.removed_schema, STAGE)])
            self.removed_w.write(table)
            self.removed_rows, self.page_rows = [], []
        if self.kept_w is not None and (final or self.kept_bytes >= self.shard_bytes):
            self.kept_shards.append(self.kept_w.close())
            self.kept_w = None
            self.kept_bytes = 0

    def close(self) -> Shard:
        self.flush(final=True)
        return self.removed_w.close()

    def abort(self) -> None:
        if self.kept_w is not None:
            self.kept_w.abort()
        self.removed_w.abort()


def page_row(doc: dict, first: int, last: int, reason: str, detail: str | None) -> dict:
    """The removed row of a page (`first` == `last`, from 1) or run of pages a PDF dropped: the
    document's id with the page(s), its source, url and date, no text."""
    meta = {"pdf_document": doc["id"], "pdf_page": first, **({"pdf_page_last": last} if last != first else {}),
            **({"pdf_error": detail} if detail else {})}
    pages = f"page={first}" if first == last else f"pages={first}-{last}"
    return {"id": f"{doc['id']}#{pages}", "text": "", "source": doc["source"], "url": doc["url"], "date": doc["date"],
            "content_type": doc["content_type"], "metadata": json.dumps(meta, sort_keys=True), "reason": reason,
            "text_bytes": None}


def reason_counts(rows: list[dict]) -> dict[str, int]:
    """Quarantined rows by the stable head of their reason ("malformed JSON: ..." → "malformed JSON")."""
    out: dict[str, int] = {}
    for r in rows:
        head = r["reason"].split(":")[0]
        out[head] = out.get(head, 0) + 1
    return out


def write_quarantine(path: Path, rows: list[dict]) -> Shard:
    w = ShardWriter(path, QUARANTINE_SCHEMA)
    w.write(pa.Table.from_pylist(rows, QUARANTINE_SCHEMA))
    return w.close()


def aggregate_extract(results: list[ExtractResult]) -> dict:
    """Extract's stage report: the units' results summed as any stage's (`driver.aggregate`), plus
    records read, quarantine by reason and each input file's account, checked:
    documents + quarantined = records read, and the files' records add up to the units'."""
    report = aggregate(STAGE, results)
    report["records_read"] = sum(r.records_read for r in results)
    report["quarantined"] = sum(r.quarantined for r in results)
    report["removed_page_rows"] = sum(r.removed_page_rows for r in results)   # in removed/, not documents
    q: dict[str, int] = {}
    for r in results:
        for k, n in r.quarantine_by_reason.items():
            q[k] = q.get(k, 0) + n
    report["quarantine_by_reason"] = dict(sorted(q.items(), key=lambda kv: -kv[1]))
    report["files"] = [{"source": f.source, "part": f.part, "unit": r.shard, "records_read": f.records_read, "documents": f.documents,
                        "kept": f.kept, "quarantined": f.quarantined, "skipped_records": f.skipped_records}
                       for r in results for f in r.files]
    if report["input_docs"] + report["quarantined"] != report["records_read"]:
        raise AssertionError("extract: documents + quarantined != records read")
    if sum(f["records_read"] for f in report["files"]) != report["records_read"]:
        raise AssertionError("extract: the files' records do not add up to the units'")
    return report
