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
import socket
from pathlib import Path
from typing import Iterator

from quipu.catalog.errors import UserError
from quipu.catalog.files import read_json, remove_stale_temporaries, sha256_json, write_json_atomic

LOCK_NAME = ".quipu.lock"
IDENTITY_NAME = ".quipu-run.json"
MANIFEST_NAME = ".quipu-manifest.json"   # {"foreign": files not ours when the run began, "written": what it wrote}


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


def record_written(run_dir: str | os.PathLike, owned: list[str]) -> None:
    """At the end of a run: the manifest lists what it wrote (what a later `--overwrite` removes)."""
    run_dir = Path(run_dir)
    m = _manifest(run_dir) or {"foreign": []}
    written = files_under(run_dir, owned) - set(m["foreign"])
    write_json_atomic(run_dir / MANIFEST_NAME, {"foreign": m["foreign"], "written": sorted(written)})


def is_foreign(run_dir: str | os.PathLike, rel: str) -> bool:
    """Whether `rel` in OUT was there, not written by quipu, when this run began."""
    m = _manifest(Path(run_dir))
    return m is not None and rel in m["foreign"]


def refuse_output_among_inputs(run_dir: str | os.PathLike, patterns: list[str], files: list[str]) -> None:
    """One line, whatever the flags, if OUT is inside the input set: a rerun would read the run's own
    outputs as input (an input folder holding OUT, a recursive glob above it, or a matched file in it)."""
    out = Path(run_dir).resolve()

    def inside(p: Path) -> bool:
        return p == out or out in p.parents

    for f in files:
        if "://" not in f and inside(Path(f).resolve()):
            raise UserError(f"output {out} is inside the inputs ({f} is in it): choose an --output outside them")
    for pattern in patterns:
        if "://" in pattern:
            continue
        base = Path(pattern.split("*", 1)[0].split("?", 1)[0].split("[", 1)[0] or ".").expanduser().resolve()
        recursive = "**" in pattern or (("*" not in pattern) and base.is_dir())
        if recursive and (out == base or base in out.parents):
            raise UserError(f"output {out} is inside the input {pattern}: its outputs would be read as input; "
                            "choose an --output outside it")


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


def files_under(run_dir: Path, owned: list[str]) -> set[str]:
    """Every file (or link) in the `owned` entries of OUT, relative to OUT."""
    found: set[str] = set()
    for name in owned:
        p = run_dir / name
        if p.is_dir() and not p.is_symlink():
            for d, _, names in os.walk(p):
                found.update(os.path.relpath(os.path.join(d, n), run_dir) for n in names)
        elif p.is_file() or p.is_symlink():
            found.add(name)
    return found


def _manifest(run_dir: Path) -> dict | None:
    try:
        m = read_json(run_dir / MANIFEST_NAME)
        return m if isinstance(m, dict) and isinstance(m.get("foreign"), list) else None
    except (OSError, ValueError):
        return None


def quipus_files(run_dir: Path, owned: list[str]) -> set[str]:
    """What earlier runs wrote into OUT: a finished run's manifest; for a killed one, everything in
    the owned entries but the files that were there before it began; with no manifest (a run of an
    older quipu) the owned entries whole if an identity says quipu ran there, else nothing."""
    present = files_under(run_dir, owned)
    m = _manifest(run_dir)
    if m is None:
        return present if (run_dir / IDENTITY_NAME).exists() else set()
    if isinstance(m.get("written"), list):
        return present & set(m["written"])
    return present - set(m["foreign"])


def _remove(run_dir: Path, rels: set[str], owned: list[str]) -> None:
    """Delete the files `rels`, then the folders of the owned entries that this left empty."""
    for rel in sorted(rels):
        with contextlib.suppress(FileNotFoundError):
            (run_dir / rel).unlink()
    for name in owned:
        top = run_dir / name
        if top.is_dir() and not top.is_symlink():
            for d, _, _ in sorted(os.walk(top), key=lambda t: -t[0].count(os.sep)):
                with contextlib.suppress(OSError):   # not empty: a user's file is in it
                    os.rmdir(d)


def claim(run_dir: str | os.PathLike, ident: dict, owned: list[str], overwrite: bool = False) -> int:
    """Make OUT this run's (call while holding `output_lock`): refuse another run's results unless
    `overwrite`, which deletes what earlier runs wrote there (their manifest), never a user's files;
    then clear a killed run's temporaries in the owned entries. Records the files in those entries
    that are not quipu's (`.quipu-manifest.json`) so that `record_written` can list what this run
    wrote. Returns how many temporaries were removed."""
    run_dir = Path(run_dir)
    ident_path = run_dir / IDENTITY_NAME
    ours = quipus_files(run_dir, owned)
    if not overwrite:
        check_identity(run_dir, ident, owned)
    else:
        _remove(run_dir, ours, owned)
        ours = set()
    foreign = files_under(run_dir, owned) - ours
    write_json_atomic(run_dir / MANIFEST_NAME, {"foreign": sorted(foreign), "written": None})
    write_json_atomic(ident_path, ident)
    return sum(remove_stale_temporaries(run_dir / name) if (run_dir / name).is_dir() else 0 for name in owned) \
        + remove_stale_temporaries(run_dir, recursive=False)
