"""Where an input is and what it is on disk: a local path or a URL, the name it is recorded under,
why a path must not be opened, its size; and `FileSlice`, the part of a large file that one work
unit reads (planned by the format's slicer or page planner, quipu.tasks.reading.formats)."""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass

import fsspec


def local_path(path: str) -> str | None:
    """The local file system path of `path`, or None for a remote URL."""
    if path.startswith("file://"):
        return path[len("file://"):]
    return None if "://" in path else path


def source_name(path: str) -> str:
    """The path as recorded (quarantine `source`, reports, catalog): itself, or for a name whose
    bytes are not UTF-8 (the OS gives them as surrogate escapes) the bytes shown as `\\xNN`."""
    try:
        path.encode("utf-8")
        return path
    except UnicodeEncodeError:
        return os.fsencode(path).decode("utf-8", "backslashreplace")


def file_problem(path: str) -> str | None:
    """Why a local path must not be opened (not a regular file), or None.
    Never blocks: a FIFO is only stat'ed, not opened."""
    local = local_path(path)
    if local is None:
        return None
    try:
        st = os.stat(local)
    except FileNotFoundError:
        return ("dangling symbolic link: its target does not exist" if os.path.islink(local)
                else "file not found (removed while the run was starting?)")
    except OSError as e:
        return f"cannot read file: {type(e).__name__}: {e}"
    if stat.S_ISREG(st.st_mode):
        return None
    kind = ("named pipe (FIFO)" if stat.S_ISFIFO(st.st_mode) else "character device" if stat.S_ISCHR(st.st_mode)
            else "block device" if stat.S_ISBLK(st.st_mode) else "socket" if stat.S_ISSOCK(st.st_mode)
            else "directory" if stat.S_ISDIR(st.st_mode) else "special file")
    return f"not a regular file ({kind}): not opened"


def file_size(path: str) -> int | None:
    """Bytes of a local or fsspec file, or None when it cannot be stat'ed (never opens it)."""
    try:
        local = local_path(path)
        if local is not None:
            return os.stat(local).st_size
        fs, _, (p,) = fsspec.get_fs_token_paths(path)
        return fs.size(p)
    except Exception:
        return None


@dataclass(frozen=True)
class FileSlice:
    """Part of one large input file, read as a work unit of its own: plain JSONL bytes
    [start, end) that begin after `before` lines, parquet row groups [start, end) that begin
    after `before` rows, or a long PDF's pages [start, end) of `before` (its page count; planned by
    quipu.tasks.reading.pdf_ranges). `first_byte`/`last_byte` bound the bytes it reads (what its hash covers)."""
    path: str
    kind: str            # "jsonl" | "parquet" | "pdf"
    start: int
    end: int
    before: int
    first_byte: int
    last_byte: int

    def describe(self) -> str:
        if self.kind == "pdf":
            return f"pages {self.start + 1}-{self.end}"
        what = "bytes" if self.kind == "jsonl" else "row groups"
        return f"{what} {self.start}-{self.end - 1}"


