"""Where things are and where they came from: runs, datasets, shards, reports, models.

`catalog` is the bottom layer: it imports neither `tasks` nor `flows`.
"""
