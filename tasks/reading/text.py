"""Plain text files (.txt): the whole file is one document, its text as written (a book, an
article, a transcript: cutting it at blank lines would make paragraphs documents, which dedup and
the quality filters then judge out of context).

UTF-8, with or without a byte-order mark; UTF-16 and UTF-32 when a byte-order mark says so. Bytes
that are not valid in that encoding make the file one quarantined record (the position of the
first bad byte, the bytes around it): no guess at a legacy encoding, which would turn "año" into
"aÃ±o" silently; convert such a file first (`iconv -f latin1 -t utf-8`). A file over
`max_record_bytes` is never held whole: it is a removed `extract:too_large` document with its first
bytes and its size. An empty file is quarantined by the reader (`read`), a blank one is removed by
extract (`extract:empty`).

A folder given as input does not take these files in (`Format.in_folders`): a data folder's
README.txt, LICENSE.txt or expected-output .txt files are not data. Name them, or match them with a
glob (`--input 'books/*.txt'`). Markdown (.md) is not read: a .md file among inputs is most often a
folder's documentation (PROVENANCE.md); add ".md" to SUFFIXES to read it as text, markup and all."""
from __future__ import annotations

import codecs
from typing import Iterator

from quipu.tasks.reading.files import FileSlice
from quipu.tasks.reading.records import (TOO_LARGE_PREFIX_BYTES, Quarantined, RawRecord, ReadLimits, ReadStats,
                                         escape_snippet, read_whole, stable_id)

SUFFIXES = (".txt",)
# the longest marks first: UTF-32's little-endian mark begins with UTF-16's
BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def read_file(path: str, stats: ReadStats, limits: ReadLimits, size: int | None,
              part: FileSlice | None) -> Iterator[RawRecord | Quarantined]:
    """The file as one document."""
    base = dict(id=stable_id(path, "file"), source=path, offset="file", content_type="text/plain")
    data = read_whole(path, limits)
    if isinstance(data, Quarantined):
        yield data
        return
    encoding = next((name for bom, name in BOMS if data.startswith(bom)), "utf-8")
    if len(data) > limits.max_record_bytes:
        prefix = data[:TOO_LARGE_PREFIX_BYTES].decode(encoding, "replace")
        yield RawRecord(**base, payload=prefix, reject="too_large", size=max(size or 0, len(data)))
        return
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as e:
        yield Quarantined(path, "file", f"invalid {encoding.removesuffix('-sig').upper()}: bad byte at position "
                                        f"{e.start} of the file (convert it to UTF-8)",
                          escape_snippet(data[max(0, e.start - 40):e.start + 40]))
        return
    yield RawRecord(**base, payload=text)
