"""tasks/partitions.py as its docstring states it: the key ranges of a plan cover the uint64 key space
once (lo <= key < hi, the last up to 2^64), and `partition_of` puts each key in the range whose rows
`key_range` reads: a key equal to a boundary belongs to the range above it, the largest key to the last."""
from __future__ import annotations

import numpy as np

from quipu.tasks.partitions import KEY_SPACE, bounds, key_range, key_ranges, n_partitions, partition_of


def test_every_key_is_in_exactly_one_range_and_partition_of_agrees():
    for n in (1, 3, 7):
        edges = bounds(n)
        assert edges[0] == 0 and edges[-1] == KEY_SPACE == 2**64 and edges == sorted(edges) and len(edges) == n + 1
        rng = np.random.default_rng(n)
        special = [0, 1, KEY_SPACE - 1] + [e for e in edges[1:-1]] + [e - 1 for e in edges[1:-1]]
        keys = np.sort(np.concatenate([rng.integers(0, 2**63, 500, dtype=np.uint64) * np.uint64(2),
                                       np.array(special, dtype=np.uint64)]))
        seen = np.zeros(len(keys), dtype=int)
        where = np.full(len(keys), -1)
        for r in key_ranges(n):
            s = key_range(keys, r.lo, r.hi)
            seen[s] += 1
            where[s] = r.p
            assert all(r.lo <= int(k) < r.hi for k in keys[s])
        assert (seen == 1).all(), n                                 # none lost, none twice
        assert (partition_of(keys, n) == where).all(), n
        assert where[-1] == n - 1                                   # 2^64 - 1: the last range
        for p, e in enumerate(edges[1:-1], 1):                      # a boundary key: the range above it
            assert partition_of(np.array([e], dtype=np.uint64), n)[0] == p


def test_partition_count_keeps_each_at_about_partition_rows():
    assert n_partitions(0, 1000) == 1 and n_partitions(1000, 1000) == 1 and n_partitions(1001, 1000) == 2
    assert n_partitions(10, 1000, minimum=4) == 4
