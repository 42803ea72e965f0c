"""The `watch` flow: notice new or changed input files and announce them.

It lists the configured locations through fsspec (local directories, `s3://…`, `gs://…`, …),
compares what it finds with the catalog's `files_seen` table (path, size, mtime, optionally a
checksum) and emits one Prefect event `quipu.data.arrived` whose payload carries the new paths.
The `curate` deployment has a trigger on that event (deploy/prefect.yaml) that starts an
incremental run over exactly those files.

A file still being written is not announced: it must show the same size and mtime on two looks
`settle_s` apart, or, with `marker_suffix` set (e.g. `.done`), have its marker file beside it.
Partial-download names (dot files, `*.part`, `*.tmp`, `*.crdownload`) are never candidates.

`quipu watch --once` does the same without a Prefect server (for cron): it runs `curate`
directly over the new files and records them as seen only after that run completed.
"""
from __future__ import annotations

import datetime as dt
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import fsspec
from prefect import flow, get_run_logger
from pydantic import BaseModel, ConfigDict, Field, field_validator

from quipu.catalog import registry
from quipu.catalog.files import sha256_file, sha256_json
from quipu.tasks.readers import SUPPORTED

EVENT = "quipu.data.arrived"
RESOURCE_PREFIX = "quipu.watch."
PARTIAL_SUFFIXES = (".part", ".tmp", ".crdownload", ".partial", ".filepart")


class WatchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field("raw", pattern=r"^[a-z0-9-]+$", description="names this watcher in the event's resource id (quipu.watch.<name>)")
    locations: list[str] = Field(default_factory=lambda: ["data/raw"], description="directories or fsspec URLs to watch (searched recursively)")
    suffixes: list[str] = Field(default_factory=lambda: list(SUPPORTED), description="file name endings that are inputs")
    settle_s: float = Field(5.0, ge=0, le=3600, description="seconds between the two looks; a file whose size or mtime changed in between is still being written")
    marker_suffix: str | None = Field(None, description="if set (e.g. '.done'), a file is ready only once FILE+marker exists; replaces the two looks")
    checksum: bool = Field(False, description="also compare sha256 (local files): a touched but unchanged file is not new")
    max_files: int = Field(1000, ge=1, description="most files announced per event; the rest wait for the next look")
    output_root: str = Field("runs/incremental", description="each incremental curate run writes to OUTPUT_ROOT/inc-<time>-<hash>")
    curate_config: str = Field("configs/curate/demo.yaml", description="curate config used by `quipu watch --once`")

    @field_validator("locations", "suffixes", mode="before")
    @classmethod
    def _one_or_many(cls, v):
        return [v] if isinstance(v, str) else v

    @field_validator("locations")
    @classmethod
    def _some(cls, v):
        if not v:
            raise ValueError("give at least one location to watch")
        return v


@dataclass(frozen=True)
class FileState:
    path: str          # absolute local path, or a full fsspec URL
    size: int
    mtime: float
    checksum: str | None = None


@dataclass
class Scan:
    """One watcher look over all locations."""
    new: dict[str, list[FileState]]        # location -> ready files that are new or changed
    unsettled: list[str]                   # still being written (or without their marker)
    unchanged: int = 0
    deferred: int = 0                      # ready, but over max_files: announced next time

    @property
    def paths(self) -> list[str]:
        return [f.path for files in self.new.values() for f in files]


def _mtime(info: dict) -> float:
    for key in ("mtime", "LastModified", "last_modified", "updated", "mtime_ns", "created"):
        v = info.get(key)
        if v is None:
            continue
        if isinstance(v, dt.datetime):
            return v.timestamp()
        if isinstance(v, str):
            try:
                return dt.datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
        return float(v) / (1e9 if key == "mtime_ns" else 1)
    return 0.0


class Location:
    """One watched directory or URL, listed through fsspec."""

    def __init__(self, url: str):
        self.fs, root = fsspec.core.url_to_fs(url)
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,))
        self.root = str(Path(root).resolve()) if self.local else root
        self.key = self.root if self.local else self.fs.unstrip_protocol(root)

    def _name(self, p: str) -> str:
        return str(Path(p)) if self.local else self.fs.unstrip_protocol(p)

    def listing(self) -> dict[str, int | float]:
        """path -> (size, mtime) of every file below the location; a missing location is empty."""
        if not self.fs.exists(self.root):
            return {}
        found = self.fs.find(self.root, detail=True)
        return {self._name(p): (int(info.get("size") or 0), _mtime(info)) for p, info in found.items()
                if info.get("type", "file") == "file"}

    def checksum(self, path: str) -> str | None:
        return sha256_file(path) if self.local else None


def is_candidate(path: str, cfg: WatchConfig) -> bool:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    if name.startswith(".") or name.lower().endswith(PARTIAL_SUFFIXES):
        return False
    if cfg.marker_suffix and name.endswith(cfg.marker_suffix):
        return False
    return name.lower().endswith(tuple(s.lower() for s in cfg.suffixes))


def ready_files(first: dict, second: dict, cfg: WatchConfig) -> tuple[list[str], list[str]]:
    """Split candidates into (ready, still being written) from two listings of one location."""
    ready, unsettled = [], []
    for path in sorted(second):
        if not is_candidate(path, cfg):
            continue
        if cfg.marker_suffix:
            ok = (path + cfg.marker_suffix) in second
        else:
            ok = first.get(path) == second[path]
        (ready if ok else unsettled).append(path)
    return ready, unsettled


def is_new(state: FileState, seen: dict | None) -> bool:
    if seen is None:
        return True
    if seen.get("size") == state.size and abs((seen.get("mtime") or 0.0) - state.mtime) < 1e-6:
        return False
    if state.checksum and seen.get("checksum"):
        return state.checksum != seen["checksum"]
    return True


def scan(cfg: WatchConfig, sleep: Callable[[float], None] = time.sleep) -> Scan:
    """Look twice (or check markers), then keep the ready files the catalog has not seen as they are."""
    locations = [Location(u) for u in cfg.locations]
    first = [loc.listing() for loc in locations]
    if not cfg.marker_suffix and cfg.settle_s > 0 and any(first):
        sleep(cfg.settle_s)
    second = [loc.listing() for loc in locations] if not cfg.marker_suffix else first
    result = Scan(new={}, unsettled=[])
    budget = cfg.max_files
    for loc, a, b in zip(locations, first, second):
        ready, unsettled = ready_files(a, b, cfg)
        result.unsettled += unsettled
        seen = registry.files_seen(loc.key)
        fresh = []
        for path in ready:
            size, mtime = b[path]
            state = FileState(path, size, mtime, loc.checksum(path) if cfg.checksum else None)
            if not is_new(state, seen.get(path)):
                result.unchanged += 1
            elif budget > 0:
                fresh.append(state)
                budget -= 1
            else:
                result.deferred += 1
        if fresh:
            result.new[loc.key] = fresh
    return result


def mark_seen(result: Scan, run_id: str | None) -> None:
    for location, files in result.new.items():
        registry.mark_files_seen(location, [asdict(f) for f in files], run_id)


def incremental_output(cfg: WatchConfig, paths: list[str]) -> str:
    """A fresh run directory per batch of new files: OUTPUT_ROOT/inc-<UTC time>-<hash of the paths>."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return str(Path(cfg.output_root).resolve() / f"inc-{stamp}-{sha256_json(paths)[:8]}")


def announce(cfg: WatchConfig, result: Scan) -> dict:
    """Emit `quipu.data.arrived` for the new files; returns the event's payload and id."""
    from prefect.events import emit_event

    paths = result.paths
    payload = {"paths": paths, "output": incremental_output(cfg, paths), "locations": sorted(result.new),
               "count": len(paths)}
    event = emit_event(event=EVENT, resource={"prefect.resource.id": RESOURCE_PREFIX + cfg.name,
                                              "prefect.resource.name": f"quipu watcher {cfg.name}"},
                       payload=payload)
    if event is None:
        raise RuntimeError("Prefect did not accept the event (no API configured?)")
    return {"event_id": str(event.id), "occurred": event.occurred.isoformat(), **payload}


@flow(name="watch", log_prints=True, persist_result=False)
def watch(config: WatchConfig = WatchConfig()) -> dict:
    """Announce new or changed input files with a `quipu.data.arrived` event (nothing new: no event)."""
    log = get_run_logger()
    result = scan(config)
    out = {"new": len(result.paths), "unsettled": result.unsettled, "unchanged": result.unchanged,
           "deferred": result.deferred}
    if result.unsettled:
        log.info("%d files still being written, left for the next look: %s", len(result.unsettled),
                 ", ".join(result.unsettled[:5]))
    if not result.paths:
        log.info("no new input files (%d unchanged)", result.unchanged)
        return out
    sent = announce(config, result)
    mark_seen(result, sent["event_id"])
    log.info("announced %d new files in event %s; curate output %s", len(result.paths), sent["event_id"], sent["output"])
    return {**out, **sent}
