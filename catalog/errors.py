"""The base of every error the user can fix (a missing file, a bad name, a busy output folder).

The code that detects one words it for the user; the CLI prints it as one line without a traceback
and exits with its `exit_code` (2: change something and rerun; 1: the run failed, rerun).
"""
from __future__ import annotations


class UserError(Exception):
    exit_code = 2


def printable(text: str) -> str:
    """`text` safe to print on a terminal: control characters (ESC sequences in a file name, a
    newline in a reason) and undecodable bytes (surrogate escapes) shown as escapes."""
    return "".join(c if c.isprintable() or c == " " else
                   (f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else c.encode("unicode_escape").decode())
                   for c in text)
