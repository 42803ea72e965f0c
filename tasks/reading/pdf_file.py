"""PDF files: one file is one record, a document whose pages stage extract reads (its extractor,
quipu.tasks.reading.pdf); a local file is read where it lies, a remote one is fetched whole (up to
`max_record_bytes`, else removed as `extract:too_large`). A long local PDF is read as page ranges
(its page planner, quipu.tasks.reading.pdf_ranges)."""
from __future__ import annotations

from typing import Iterator

from quipu.tasks.reading.files import FileSlice, local_path
from quipu.tasks.reading.records import Quarantined, RawRecord, ReadLimits, ReadStats, read_whole, stable_id


def read_file(path: str, stats: ReadStats, limits: ReadLimits, size: int | None,
              part: FileSlice | None) -> Iterator[RawRecord | Quarantined]:
    return read_pdf_file(path, limits, size)


def read_pdf_file(path: str, limits: ReadLimits = ReadLimits(), size: int | None = None) -> Iterator[RawRecord | Quarantined]:
    """One PDF file as one record; its pages are read by stage extract (quipu.tasks.reading.pdf)."""
    base = dict(id=stable_id(path, "file"), source=path, offset="file", content_type="application/pdf")
    local = local_path(path)
    if local is not None:
        yield RawRecord(**base, payload=local, kind="pdf")
        return
    if size is not None and size > limits.max_record_bytes:
        yield RawRecord(**base, reject="too_large", size=size)
        return
    data = read_whole(path, limits)
    if isinstance(data, Quarantined):
        yield data
        return
    if len(data) > limits.max_record_bytes:
        yield RawRecord(**base, reject="too_large", size=size or len(data))
        return
    yield RawRecord(**base, payload=data, kind="pdf")
