"""Out-of-core joins by hash range: what the partitioned plans of global stages (dedup's band
buckets, lines' line counts) share.

A scan writes its rows once, sorted by a 64-bit key, as a `SortedRun` (one `.npy` per column,
memory-mapped when read). A partitioned plan splits the key space into equal ranges (`bounds`);
the task of partition p reads only the rows with bounds[p] <= key < bounds[p+1] of every run
(a binary search in each memory-mapped key column), so its memory is one partition whatever the
size of the run, and partitions are independent tasks that run in parallel.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from quipu.catalog.files import atomic_path, sha256_file, sha256_json

KEY_SPACE = 1 << 64


def save_npy(path: Path, arr: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.save(fh, arr)


def bounds(n_parts: int) -> list[int]:
    """n_parts + 1 boundaries of equal ranges of the uint64 key space (the last is 2^64)."""
    return [(p * KEY_SPACE) // n_parts for p in range(n_parts)] + [KEY_SPACE]


class KeyRange(BaseModel):
    """One partition of a partitioned plan: keys lo <= key < hi, partition `p` of the plan."""
    p: int
    lo: int
    hi: int


def key_ranges(n_parts: int) -> list[KeyRange]:
    edges = bounds(n_parts)
    return [KeyRange(p=p, lo=edges[p], hi=edges[p + 1]) for p in range(n_parts)]


def n_partitions(rows: int, partition_rows: int, minimum: int = 1) -> int:
    """How many key ranges keep each at about `partition_rows` rows (uniform hashes)."""
    return max(minimum, math.ceil(rows / partition_rows))


def key_range(keys: np.ndarray, lo: int, hi: int) -> slice:
    """The rows of a sorted uint64 key column with lo <= key < hi (hi may be 2^64)."""
    a = int(np.searchsorted(keys, np.uint64(lo)))
    b = len(keys) if hi >= KEY_SPACE else int(np.searchsorted(keys, np.uint64(hi)))
    return slice(a, b)


def partition_of(keys: np.ndarray, n_parts: int) -> np.ndarray:
    """The partition of each key under `bounds(n_parts)` (vectorised)."""
    edges = np.array(bounds(n_parts)[1:-1], dtype=np.uint64)
    return np.searchsorted(edges, keys, side="right")


class SortedRun(BaseModel):
    """Rows sorted by their first column (a uint64 key), one `<prefix>.<column>.npy` per column."""
    prefix: str
    columns: list[str]
    rows: int

    def path(self, column: str) -> str:
        return f"{self.prefix}.{column}.npy"

    def arrays(self) -> dict[str, np.ndarray]:
        return {c: np.load(self.path(c), mmap_mode="r") for c in self.columns}

    def slice(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        """The rows with lo <= key < hi, read from disk (only those pages)."""
        cols = self.arrays()
        s = key_range(cols[self.columns[0]], lo, hi)
        return {c: np.array(a[s]) for c, a in cols.items()}

    def sha256(self) -> str:
        return sha256_json([sha256_file(self.path(c)) for c in self.columns])

    def delete(self) -> None:
        for c in self.columns:
            Path(self.path(c)).unlink(missing_ok=True)

    @staticmethod
    def write(prefix: Path | str, columns: dict[str, np.ndarray], sort: bool = True) -> "SortedRun":
        """Write `columns` (the first is the key), sorted by key and then by the other columns."""
        names = list(columns)
        if sort and len(columns[names[0]]):
            order = np.lexsort([columns[c] for c in reversed(names)])
            columns = {c: columns[c][order] for c in names}
        for c in names:
            save_npy(Path(f"{prefix}.{c}.npy"), np.ascontiguousarray(columns[c]))
        return SortedRun(prefix=str(prefix), columns=names, rows=len(columns[names[0]]))


class NpyRows:
    """Rows of a `.npy` file read with `pread`: only the bytes asked for enter memory (a memory map
    keeps every page it touched resident, and counted in the process's RSS, until it is closed)."""

    def __init__(self, path: str | Path):
        with open(path, "rb") as fh:
            major, _ = np.lib.format.read_magic(fh)
            read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            self.shape, fortran, self.dtype = read_header(fh)
            self.offset = fh.tell()
        if fortran:
            raise ValueError(f"{path}: Fortran-ordered arrays are not read by rows")
        self.row_shape = tuple(self.shape[1:])
        self.row_bytes = int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize
        self.fd = os.open(path, os.O_RDONLY)

    def __len__(self) -> int:
        return int(self.shape[0])

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Rows start..stop-1, copied into memory."""
        n = max(0, int(stop) - int(start))
        data = os.pread(self.fd, n * self.row_bytes, self.offset + int(start) * self.row_bytes)
        return np.frombuffer(data, self.dtype).reshape((n, *self.row_shape))

    def take(self, idx: np.ndarray) -> np.ndarray:
        """The given rows (any order), one read per row."""
        out = np.empty((len(idx), *self.row_shape), self.dtype)
        for k, i in enumerate(idx.tolist()):
            out[k] = self.rows(i, i + 1)[0]
        return out

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
