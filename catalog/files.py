"""Atomic writes and content hashes: the one place every layer writes files through.

A file only ever appears under its final name complete: it is written to a temporary name in the
same directory, flushed, fsynced and renamed. A killed process leaves at worst a `.tmp-quipu-*` file,
which `remove_stale_temporaries` clears on the next run.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterator

TMP_PREFIX = ".tmp-quipu-"   # only files with this prefix are ever cleaned up as quipu's


def _process_umask() -> int:
    mask = os.umask(0o022)   # reading the umask means setting it: put it straight back
    os.umask(mask)
    return mask


UMASK = _process_umask()


def default_mode(directory: bool = False) -> int:
    """The mode a plain `open()` / `mkdir()` would give under the process umask. Temporary files
    and folders are created private (0600 / 0700); the final output must be readable by whoever the
    umask allows (teammates, a serving container), so it gets this mode before it is renamed."""
    return (0o777 if directory else 0o666) & ~UMASK


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to `final`; rename it onto `final` if the block succeeds."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX + final.name + ".", dir=final.parent)
    os.fchmod(fd, default_mode())
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        try:
            yield tmp_path
            with open(tmp_path, "rb+") as fh:
                os.fsync(fh.fileno())
                os.fchmod(fh.fileno(), default_mode())   # a writer that replaced the file (safetensors) made it 0600
            os.replace(tmp_path, final)
        except OSError as e:
            raise with_path(e, final) from e
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def with_path(e: OSError, path: str | os.PathLike) -> OSError:
    """`e` naming the file it was about: pyarrow's and zstd's writers drop the path (and pyarrow
    puts the errno in its message: "... Detail: [errno 28] No space left on device")."""
    if e.filename is not None:
        return e
    m = re.search(r"\[errno (\d+)\]", str(e))
    code = e.errno if e.errno is not None else int(m.group(1)) if m else None
    if code is None:
        code = _short_write_errno(e, path)
    return OSError(code, os.strerror(code), str(path)) if code is not None else e


_SHORT_WRITE = re.compile(r"(\d+) requested and (\d+) written")   # numpy's tofile/np.save: no errno


def _short_write_errno(e: OSError, path: str | os.PathLike) -> int | None:
    """The errno of a short write that lost it: ENOSPC when the file's filesystem has no room left
    for what was requested (at 8 bytes an item), else EIO; None when `e` is no short write."""
    m = _SHORT_WRITE.search(str(e))
    if m is None:
        return None
    try:
        st = os.statvfs(os.path.dirname(os.path.abspath(path)) or ".")
        full = st.f_bavail * st.f_frsize < 8 * (int(m.group(1)) - int(m.group(2)))
    except OSError:
        full = True
    return errno.ENOSPC if full else errno.EIO


def write_bytes_atomic(final: str | os.PathLike, data: bytes) -> None:
    with atomic_path(final) as tmp:
        tmp.write_bytes(data)


def write_json_atomic(final: str | os.PathLike, obj: Any) -> None:
    write_bytes_atomic(final, (json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n").encode())


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text())


def read_blocks(fh, chunk: int, end: int | None = None) -> Iterator[bytes]:
    """An open binary file's bytes from where it stands, in blocks of `chunk`, up to byte `end`
    when given (else to the end of the file)."""
    left = None if end is None else end - fh.tell()
    while left is None or left > 0:
        block = fh.read(chunk if left is None else min(chunk, left))
        if not block:
            return
        if left is not None:
            left -= len(block)
        yield block


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20, start: int = 0, end: int | None = None) -> str:
    """Hash of the file's bytes [start, end) (the whole file by default)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        fh.seek(start)
        for block in read_blocks(fh, chunk, end):
            h.update(block)
    return h.hexdigest()


def sha256_json(obj: Any) -> str:
    """Hash of a JSON-serialisable object with sorted keys: the config and fingerprint hash."""
    h = hashlib.sha256()
    for chunk in json.JSONEncoder(sort_keys=True, default=str).iterencode(obj):   # never one huge string
        h.update(chunk.encode())
    return h.hexdigest()


def remove_stale_temporaries(root: str | os.PathLike, recursive: bool = True) -> int:
    """Delete temporaries a killed quipu process left under `root` (or only in `root` itself);
    returns how many. Only files named with quipu's own prefix are touched: a user's `.tmp-notes`
    beside them stays."""
    n = 0
    root = Path(root)
    if not root.is_dir():
        return 0
    for p in (root.rglob if recursive else root.glob)(TMP_PREFIX + "*"):
        if p.is_file() and not p.is_symlink():
            p.unlink()
            n += 1
    return n
