"""The `watch` flow: notice new or changed input files and announce them.

It lists the configured locations through fsspec (local directories, `s3://…`, `gs://…`, …),
compares what it finds with the catalog's `files_seen` table (path, size, mtime, optionally a
checksum) and emits one Prefect event `quipu.data.arrived` whose payload carries the new paths.
The `curate` deployment has a trigger on that event (deploy/prefect.yaml) that starts an
incremental run over exactly those files, into the dataset `dataset` (a new version of it).

Announced files are *pending* (table `files_pending`) until the curate run that took them
completes: each look first settles the pending batches. A completed run marks its files seen; a
failed, crashed or cancelled one (or none at all `retry_after_s` after the event) puts them back,
so they are announced again, up to `max_attempts` times.

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
from quipu.flows.run_names import watch_name
from quipu.flows.runners import checkout_warning
from quipu.catalog.files import sha256_file, sha256_json
from quipu.tasks.reading import FOLDER_SUFFIXES

EVENT = "quipu.data.arrived"
RESOURCE_PREFIX = "quipu.watch."
PARTIAL_SUFFIXES = (".part", ".tmp", ".crdownload", ".partial", ".filepart")


class WatchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field("raw", pattern=r"^[a-z0-9-]+$", description="names this watcher in the event's resource id (quipu.watch.<name>)")
    locations: list[str] = Field(default_factory=lambda: ["data/raw"], description="directories or fsspec URLs to watch (searched recursively)")
    suffixes: list[str] = Field(default_factory=lambda: list(FOLDER_SUFFIXES), description="file name endings that are inputs (by default those a folder input takes in)")
    settle_s: float = Field(5.0, ge=0, le=3600, description="seconds between the two looks; a file whose size or mtime changed in between is still being written")
    marker_suffix: str | None = Field(None, description="if set (e.g. '.done'), a file is ready only once FILE+marker exists; replaces the two looks")
    checksum: bool = Field(False, description="also compare sha256 (local files): a touched but unchanged file is not new")
    max_files: int = Field(1000, ge=1, description="most files announced per event; the rest wait for the next look")
    output_root: str = Field("runs/incremental", description="each incremental curate run writes to OUTPUT_ROOT/inc-<time>-<hash>")
    dataset: str = Field("crawl", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="the curated dataset the new files go into: each curate run adds a version (and dedups against the earlier ones)")
    retry_after_s: float = Field(3600, gt=0, le=30 * 86400, description="announced files with no curate run this long after the event are announced again")
    max_attempts: int = Field(3, ge=1, description="files whose curate runs failed this many times wait (logged) until they change")
    curate_config: str = Field("configs/curate/default.yaml", description="curate config used by `quipu watch --once`")

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
    pending: int = 0                       # announced, their curate run not completed yet

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
        pending = {r["path"]: r for r in registry.files_pending(loc.key) if r["output"]}   # "" : to announce again
        fresh = []
        for path in ready:
            size, mtime = b[path]
            state = FileState(path, size, mtime, loc.checksum(path) if cfg.checksum else None)
            if not is_new(state, seen.get(path)):
                result.unchanged += 1
            elif not is_new(state, pending.get(path)):
                result.pending += 1
            elif budget > 0:
                fresh.append(state)
                budget -= 1
            else:
                result.deferred += 1
        if fresh:
            result.new[loc.key] = fresh
    return result


def missing_locations(cfg: WatchConfig) -> list[str]:
    """A warning per watched location that does not exist (a typo, a mount that is not there):
    looking at it finds nothing, which is not the same as "no new files"."""
    out = []
    for url in cfg.locations:
        loc = Location(url)
        if not loc.fs.exists(loc.root):
            out.append(f"watched location {url} does not exist ({loc.key}; relative paths are from {Path.cwd()}): "
                       "create it, or set `locations` in the watch config")
    return out


def mark_seen(result: Scan, run_id: str | None) -> None:
    for location, files in result.new.items():
        registry.mark_files_seen(location, [asdict(f) for f in files], run_id)


def mark_pending(result: Scan, event_id: str, output: str) -> None:
    for location, files in result.new.items():
        registry.add_files_pending(location, [asdict(f) for f in files], event_id, output)


# What became of the curate run an announcement asked for (Prefect state types).
DONE, FAILED, ACTIVE = "COMPLETED", ("FAILED", "CRASHED", "CANCELLED"), ("SCHEDULED", "PENDING", "RUNNING", "PAUSED", "CANCELLING")


def curate_run_state(output: str, since: dt.datetime) -> tuple[str | None, str | None]:
    """(state type, flow run id) of the newest curate flow run into `output` created after `since`;
    (None, None) when there is none. Asks the Prefect API; the catalog answers for runs it knows
    completed when the API has no such run (e.g. a cron `quipu watch --once` elsewhere)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterExpectedStartTime
    from prefect.client.schemas.sorting import FlowRunSort

    since = since.replace(tzinfo=dt.timezone.utc) - dt.timedelta(minutes=1)
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["curate"])),
            flow_run_filter=FlowRunFilter(expected_start_time=FlowRunFilterExpectedStartTime(after_=since)),
            sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=200)
    for r in runs:
        cfg = (r.parameters or {}).get("config") or {}
        if isinstance(cfg, dict) and cfg.get("output") == output:
            return (r.state.type.value if r.state else "PENDING"), str(r.id)
    run = registry.get_run(output)
    if run is not None and run["status"] == "completed":
        return DONE, run["id"]
    return None, None


def settle_pending(cfg: WatchConfig, log=None) -> dict:
    """Look at the curate runs of announced files: completed → seen; failed/crashed/cancelled, or
    no run after `retry_after_s` → announce again (up to `max_attempts`); still running → wait."""
    counts = {"seen": 0, "retry": 0, "waiting": 0, "gave_up": 0}
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    for loc in (Location(u).key for u in cfg.locations):
        batches: dict[str, list[dict]] = {}
        for row in registry.files_pending(loc):
            if row["output"]:
                batches.setdefault(row["output"], []).append(row)
        for output, rows in batches.items():
            announced = min(r["announced"] for r in rows)
            state, run_id = curate_run_state(output, announced)
            paths = [r["path"] for r in rows]
            if state == DONE:
                registry.mark_files_seen(loc, rows, run_id)
                registry.drop_files_pending(loc, paths)
                counts["seen"] += len(rows)
            elif state in FAILED or (state is None and (now - announced).total_seconds() > cfg.retry_after_s):
                if max(r["attempts"] or 1 for r in rows) >= cfg.max_attempts:
                    counts["gave_up"] += len(rows)
                    if log:
                        log.warning("%d files failed to curate %d times (last run %s, %s): left until they change: %s",
                                    len(rows), cfg.max_attempts, run_id, state, ", ".join(paths[:5]))
                    continue
                registry.requeue_files_pending(loc, paths)   # announced again below, attempts counted on
                counts["retry"] += len(rows)
                if log:
                    log.warning("curate run for %d files %s (%s): announcing them again", len(rows),
                                state.lower() if state else "never started", run_id or output)
            else:
                counts["waiting"] += len(rows)
    return counts


def incremental_output(cfg: WatchConfig, paths: list[str]) -> str:
    """A fresh run directory per batch of new files: OUTPUT_ROOT/inc-<UTC time>-<hash of the paths>."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return str(Path(cfg.output_root).resolve() / f"inc-{stamp}-{sha256_json(paths)[:8]}")


def announce(cfg: WatchConfig, result: Scan) -> dict:
    """Emit `quipu.data.arrived` for the new files; returns the event's payload and id."""
    from prefect.events import emit_event

    paths = result.paths
    payload = {"paths": paths, "output": incremental_output(cfg, paths), "dataset": cfg.dataset,
               "locations": sorted(result.new), "count": len(paths)}
    event = emit_event(event=EVENT, resource={"prefect.resource.id": RESOURCE_PREFIX + cfg.name,
                                              "prefect.resource.name": f"quipu watcher {cfg.name}"},
                       payload=payload)
    if event is None:
        raise RuntimeError("Prefect did not accept the event (no API configured?)")
    return {"event_id": str(event.id), "occurred": event.occurred.isoformat(), **payload}


@flow(name="watch", flow_run_name=watch_name, log_prints=True, persist_result=False)
def watch(config: WatchConfig = WatchConfig()) -> dict:
    """Announce new or changed input files with a `quipu.data.arrived` event (nothing new: no event)."""
    log = get_run_logger()
    for warning in [checkout_warning(__file__), *missing_locations(config)]:
        if warning:
            log.warning(warning)
    settled = settle_pending(config, log)
    result = scan(config)
    out = {"new": len(result.paths), "unsettled": result.unsettled, "unchanged": result.unchanged,
           "deferred": result.deferred, "pending": result.pending, "settled": settled}
    if result.unsettled:
        log.info("%d files still being written, left for the next look: %s", len(result.unsettled),
                 ", ".join(result.unsettled[:5]))
    if not result.paths:
        log.info("no new input files (%d unchanged, %d waiting for their curate run)", result.unchanged, result.pending)
        return out
    sent = announce(config, result)
    mark_pending(result, sent["event_id"], sent["output"])
    log.info("announced %d new files in event %s; curate output %s", len(result.paths), sent["event_id"], sent["output"])
    return {**out, **sent}
