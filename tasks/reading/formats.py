"""The format table: every input format quipu reads, one row each. A row names the file name
endings of the format, its reader, how a large file is split into work units (slicer) and, for a
format whose documents can be very long, how one document is read in partitions and combined
(page planner). What a record's payload becomes text with is the extractor table's business
(quipu.tasks.extract.EXTRACTORS, by the record's `kind`).

Adding a format is one module (a `read_file` with the signature below) and one row here; see
docs/architecture.md, "Adding a format".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from quipu.tasks.reading import jsonl, parquet, pdf_file, pdf_ranges, text, warc
from quipu.tasks.reading.files import FileSlice
from quipu.tasks.reading.pdf import PDF_SUFFIXES
from quipu.tasks.reading.records import Quarantined, RawRecord, ReadLimits, ReadStats

Reader = Callable[[str, ReadStats, ReadLimits, int | None, FileSlice | None], Iterator[RawRecord | Quarantined]]


@dataclass(frozen=True)
class Partitions:
    """A long document read as partitions and combined, as a global stage's plan is under the
    stage contract: `plan(unit, cfg)` the work units a unit is read in (itself, or its parts),
    `read(part, layout, key, fingerprint, cfg)` one part's `PhaseResult` (kept as its done-marker),
    `combine(parts, cfg, source)` what the kind's extractor reads instead of the file. `cfg` is the
    extract config block named `config`."""
    config: str
    plan: Callable
    read: Callable
    combine: Callable
    is_part: Callable       # (unit) -> whether a work unit is one of the parts


@dataclass(frozen=True)
class Format:
    kind: str
    suffixes: tuple[str, ...]
    read: Reader                        # (path, stats, limits, size in bytes or None, part or None)
    slicer: Callable | None = None      # (local path, size, part_bytes) -> FileSlices; None: read whole
    pages: Partitions | None = None     # a long document's partitions (the page planner)
    own_unit: bool = False              # a work unit of its own, whatever its bytes (its pages are the work)
    in_folders: bool = True             # a folder given as input takes these files in


FORMATS: tuple[Format, ...] = (
    Format("warc", warc.SUFFIXES, warc.read_file),
    Format("jsonl", jsonl.SUFFIXES, jsonl.read_file, slicer=jsonl.slices),
    Format("parquet", parquet.SUFFIXES, parquet.read_file, slicer=parquet.slices),
    Format("pdf", PDF_SUFFIXES, pdf_file.read_file, own_unit=True,
           pages=Partitions("pdf", pdf_ranges.plan_unit, pdf_ranges.read_range, pdf_ranges.join_ranges,
                            pdf_ranges.is_range)),
    Format("text", text.SUFFIXES, text.read_file, in_folders=False),
)
SUPPORTED = tuple(s for f in FORMATS for s in f.suffixes)
FOLDER_SUFFIXES = tuple(s for f in FORMATS if f.in_folders for s in f.suffixes)   # what a folder input takes in


def format_of(path: str) -> Format | None:
    """The format a file name ends like (the first row that matches), or None."""
    p = path.lower()
    return next((f for f in FORMATS if p.endswith(f.suffixes)), None)


def reader_kind(path: str) -> str | None:
    fmt = format_of(path)
    return fmt.kind if fmt else None
