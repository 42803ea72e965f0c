"""One run owns its output folder: an exclusive lock for the run's whole life, and an identity
(inputs + config) that decides whether a run into an existing folder resumes it or is refused.

- The lock is `OUT/.quipu.lock`, taken with `flock` (non-blocking): the operating system drops it
  when the process dies, so a killed run never leaves a stale lock behind. The file names the
  holder (pid, host, start time) for the message a second run gets.
- The identity is `OUT/.quipu-run.json`, written before any work. A later run with the same
  identity resumes (finished shards are skipped by their fingerprints); one with another identity
  is refused unless `overwrite` clears what quipu wrote there first. Settings that do not change
  the output (worker count, task runner, artifact names) are not part of the identity.
- Cleanup of a killed run's temporaries deletes only files quipu names as its own
  (`catalog.files.TMP_PREFIX`), only in the entries of OUT the run owns.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Iterator

from quipu.catalog.errors import UserError
from quipu.catalog.files import read_json, remove_stale_temporaries, sha256_json, write_json_atomic

LOCK_NAME = ".quipu.lock"
IDENTITY_NAME = ".quipu-run.json"


class OutputInUse(UserError):
    """Another live process holds the output folder."""


class OutputMismatch(UserError):
    """The output folder holds another run's results."""


def _holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(os.read(fd, 4096) or b"{}")
        return f"pid {info.get('pid', '?')} on {info.get('host', '?')} since {info.get('started', '?')}"
    except (OSError, ValueError):
        return "holder unknown"


def _lock(fd: int, run_dir: Path) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise OutputInUse(f"{run_dir} is in use by another run ({_holder(fd)}); wait for it to finish "
                          f"or choose another --output") from None


@contextlib.contextmanager
def output_lock(run_dir: str | os.PathLike) -> Iterator[Path]:
    """Hold OUT exclusively for the block; OutputInUse (one line) if another process holds it."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _lock(fd, run_dir)
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")}
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(info).encode())
        yield run_dir
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def check_free(run_dir: str | os.PathLike) -> None:
    """Fail early (before a flow starts) if OUT cannot be a run folder (an existing file, a folder we
    cannot write) or another process holds it; takes no lock."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"output {run_dir} is a file, not a folder: choose another --output")
    existing = next((p for p in [run_dir, *run_dir.parents] if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UserError(f"output {run_dir}: {existing} is a file, not a folder")
    if existing is not None and os.statvfs(existing).f_flag & os.ST_RDONLY:
        raise UserError(f"output {run_dir}: {existing} is on a read-only file system; earlier outputs are left as they were")
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"output {run_dir}: cannot write in {existing} (permission denied)")
    lock = run_dir / LOCK_NAME
    if not lock.exists():
        return
    fd = os.open(lock, os.O_RDWR)
    try:
        _lock(fd, run_dir)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def identity(inputs: list[str], config: dict, ignore: tuple[str, ...] = ()) -> dict:
    cfg = {k: v for k, v in config.items() if k not in ignore}
    return {"inputs": sorted(inputs), "config_sha256": sha256_json(cfg)}


def check_identity(run_dir: str | os.PathLike, ident: dict, owned: list[str]) -> None:
    """OutputMismatch if OUT holds another run's results (other inputs or config); writes nothing, so
    the CLI can say it before a flow starts."""
    run_dir = Path(run_dir)
    ident_path = run_dir / IDENTITY_NAME
    earlier: dict = {}
    if ident_path.exists():
        try:
            earlier = read_json(ident_path)
        except (OSError, ValueError):
            earlier = {}
        same = earlier == ident
    else:   # results without an identity: an older quipu's run, or another tool's files
        same = not any((run_dir / name).exists() for name in owned)
    if not same:
        what = ("other inputs" if earlier.get("inputs") != ident["inputs"] else "another config") if ident_path.exists() \
            else "an earlier run that recorded no identity"
        raise OutputMismatch(f"{run_dir} holds the results of a run with {what}: rerun the same command to resume it, "
                             f"pass --overwrite to replace it, or choose another --output")


def claim(run_dir: str | os.PathLike, ident: dict, owned: list[str], overwrite: bool = False) -> int:
    """Make OUT this run's (call while holding `output_lock`): refuse another run's results unless
    `overwrite`, which deletes the `owned` entries first; then clear a killed run's temporaries in
    them. Returns how many temporaries were removed."""
    run_dir = Path(run_dir)
    ident_path = run_dir / IDENTITY_NAME
    if not overwrite:
        check_identity(run_dir, ident, owned)
    else:
        for name in [n for n in owned if (run_dir / n).exists()]:
            p = run_dir / name
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    write_json_atomic(ident_path, ident)
    return sum(remove_stale_temporaries(run_dir / name) if (run_dir / name).is_dir() else 0 for name in owned) \
        + remove_stale_temporaries(run_dir, recursive=False)
