"""The base of every error the user can fix (a missing file, a bad name, a busy output folder).

The code that detects one words it for the user; the CLI prints it as one line without a traceback
and exits with its `exit_code` (2: change something and rerun; 1: the run failed, rerun).
"""
from __future__ import annotations


class UserError(Exception):
    exit_code = 2
