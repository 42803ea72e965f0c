"""Which process a record names, so that a later command can tell whether it still lives: a pid
plus the process's start time names one process even after the pid is reused."""
from __future__ import annotations

import os
import socket
from pathlib import Path


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (`/proc/PID/stat` field 22), or None if
    there is no such process: a pid plus this names one process even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()
    return fields[19].decode() if len(fields) > 19 else None


def process_owner() -> str:
    """`host:pid:start` of this process, recorded with a run so that a later command can tell
    whether the process that registered it still lives."""
    return f"{socket.gethostname()}:{os.getpid()}:{process_start(os.getpid())}"


def owner_alive(owner: str) -> bool | None:
    """Whether the process named by `process_owner()` lives; None when it ran on another host."""
    try:
        host, pid, start = owner.rsplit(":", 2)
        pid_i = int(pid)
    except ValueError:
        return None
    if host != socket.gethostname():
        return None
    return process_start(pid_i) == start
