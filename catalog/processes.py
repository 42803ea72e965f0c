"""Which process a record names, so that a later command can tell whether it still lives: a pid
plus the process's start time names one process even after the pid is reused; and a child that
dies with its parent."""
from __future__ import annotations

import ctypes
import os
import signal
import socket
from pathlib import Path


_TICK_S = 1 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def _stat_fields(pid: int) -> list[bytes]:
    """`/proc/PID/stat` from its third field (the state) on; [] if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return []
    return stat[stat.rfind(b")") + 2:].split()


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (`/proc/PID/stat` field 22), or None if
    there is no such process: a pid plus this names one process even after the pid is reused."""
    fields = _stat_fields(pid)
    return fields[19].decode() if len(fields) > 19 else None


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) a process and its reaped children have used (`/proc/PID/stat`
    fields 14-17), or None if it cannot be read."""
    fields = _stat_fields(pid)
    try:
        return sum(int(f) for f in fields[11:15]) * _TICK_S if len(fields) > 14 else None
    except ValueError:
        return None


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


PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when the thread that started it exits (Linux; a no-op
    elsewhere). Also usable as a subprocess `preexec_fn`."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
