"""Register and look up runs, datasets (with shards), reports, lineage and models."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import sqlalchemy as sa

from quipu.catalog import db
from quipu.catalog.errors import UserError
from quipu.catalog.files import sha256_file, sha256_json
from quipu.catalog.names import check_name
from quipu.catalog.processes import owner_alive, process_owner


# ---- runs -------------------------------------------------------------------------------------

def start_run(flow: str, config: dict, output: str | None, run_id: str | None = None) -> str:
    """Register a run as `running`. Reusing an id (a rerun into the same output) restarts it."""
    run_id = run_id or db.new_id(flow)
    with db.engine().begin() as conn:
        conn.execute(sa.delete(db.runs).where(db.runs.c.id == run_id))
        conn.execute(sa.insert(db.runs).values(
            id=run_id, flow=flow, output=output, config=db.dumps(config),
            config_hash=sha256_json(config), status="running", started=db.now(), owner=process_owner()))
    return run_id


def finish_run(run_id: str, status: str, summary: dict | None = None) -> None:
    with db.engine().begin() as conn:
        conn.execute(sa.update(db.runs).where(db.runs.c.id == run_id).values(
            status=status, ended=db.now(), summary=db.dumps(summary) if summary is not None else None))


def mark_stale_runs_crashed(flow: str | None = None, output: str | None = None) -> int:
    """Runs still `running` from a process that died: called when a new run into the same output starts."""
    q = sa.update(db.runs).where(db.runs.c.status == "running")
    if flow:
        q = q.where(db.runs.c.flow == flow)
    if output:
        q = q.where(db.runs.c.output == output)
    with db.engine().begin() as conn:
        return conn.execute(q.values(status="crashed", ended=db.now())).rowcount


def mark_dead_runs_crashed() -> int:
    """Runs still `running` whose process (on this host) is gone: any later command calls this,
    so a killed run does not stay `running` until another run uses its output."""
    with db.engine().connect() as conn:
        rows = conn.execute(sa.select(db.runs.c.id, db.runs.c.owner)
                            .where(db.runs.c.status == "running", db.runs.c.owner.is_not(None))).all()
    dead = [r.id for r in rows if owner_alive(r.owner) is False]
    if not dead:
        return 0
    with db.engine().begin() as conn:
        return conn.execute(sa.update(db.runs).where(db.runs.c.id.in_(dead), db.runs.c.status == "running")
                            .values(status="crashed", ended=db.now())).rowcount


def list_runs(limit: int = 50) -> list[dict]:
    with db.engine().connect() as conn:
        rows = conn.execute(sa.select(db.runs).order_by(db.runs.c.started.desc()).limit(limit)).mappings()
        return [dict(r) for r in rows]


def get_run(run_id_or_output: str) -> dict | None:
    """A run by id, or the newest run whose output directory is the given path."""
    with db.engine().connect() as conn:
        row = conn.execute(sa.select(db.runs).where(db.runs.c.id == run_id_or_output)).mappings().first()
        if row is None:
            out = str(Path(run_id_or_output).resolve())
            row = conn.execute(sa.select(db.runs).where(db.runs.c.output == out)
                               .order_by(db.runs.c.started.desc())).mappings().first()
        return dict(row) if row else None


def latest_run(flow: str, status: str | None = "completed", output: str | None = None) -> dict | None:
    q = sa.select(db.runs).where(db.runs.c.flow == flow)
    if status:
        q = q.where(db.runs.c.status == status)
    if output:
        q = q.where(db.runs.c.output == output)
    with db.engine().connect() as conn:
        row = conn.execute(q.order_by(db.runs.c.started.desc())).mappings().first()
        return dict(row) if row else None


# ---- datasets and shards ----------------------------------------------------------------------

def register_dataset(name: str, kind: str, path: str, run_id: str | None,
                     shard_rows: Iterable[dict], info: dict | None = None, shared_path: bool = False) -> str:
    """`shard_rows`: dicts with path, rows, bytes, sha256. A name is safe path components joined by
    '/' (e.g. `cc-main/quarantine`). Each registration under a name (and kind) is a new version of
    it (1, 2, ...): a curated dataset is the union of its versions, one per curate run into it.
    Re-registering a path (a rerun into the same output) replaces that version and keeps its number;
    `shared_path`: the path is a cache several datasets point into (token shards), so only this
    name's row there is replaced."""
    for part in name.split("/"):
        check_name(part, "dataset name")
    shard_rows = list(shard_rows)
    ds_id = db.new_id("ds")
    t = db.datasets
    with db.engine().begin() as conn:
        q = sa.select(t.c.id, t.c.name, t.c.version).where(t.c.path == path, t.c.kind == kind)
        old = conn.execute(q.where(t.c.name == name) if shared_path else q).mappings().all()
        version = next((o["version"] for o in old if o["name"] == name and o["version"]), None)
        for o in old:
            conn.execute(sa.delete(db.shards).where(db.shards.c.dataset_id == o["id"]))
            conn.execute(sa.delete(t).where(t.c.id == o["id"]))
        if version is None:
            top = conn.execute(sa.select(sa.func.max(t.c.version)).where(t.c.name == name, t.c.kind == kind)).scalar()
            version = (top or 0) + 1
        conn.execute(sa.insert(t).values(
            id=ds_id, name=name, kind=kind, path=path, run_id=run_id, version=version,
            rows=sum(int(s.get("rows", 0)) for s in shard_rows),
            bytes=sum(int(s.get("bytes", 0)) for s in shard_rows),
            created=db.now(), info=db.dumps(info or {})))
        if shard_rows:
            conn.execute(sa.insert(db.shards), [
                {"dataset_id": ds_id, "path": s["path"], "rows": s.get("rows"),
                 "bytes": s.get("bytes"), "sha256": s.get("sha256")} for s in shard_rows])
    return ds_id


def forget_dataset_path(path: str, kind: str) -> int:
    """Drop the datasets of `kind` registered at `path` (and their shards): what a run registered
    there is gone (an `--overwrite` run that wrote none). Returns how many were dropped."""
    t = db.datasets
    with db.engine().begin() as conn:
        ids = [r[0] for r in conn.execute(sa.select(t.c.id).where(t.c.path == path, t.c.kind == kind))]
        for ds_id in ids:
            conn.execute(sa.delete(db.shards).where(db.shards.c.dataset_id == ds_id))
            conn.execute(sa.delete(t).where(t.c.id == ds_id))
    return len(ids)


def dataset_versions(name: str, kind: str = "curated") -> list[dict]:
    """Every version of a dataset, oldest first, each with its shards (ordered by path)."""
    t = db.datasets
    with db.engine().connect() as conn:
        rows = [dict(r) for r in conn.execute(sa.select(t).where(t.c.name == name, t.c.kind == kind)
                                              .order_by(t.c.version, t.c.created)).mappings()]
        for r in rows:
            r["shards"] = [dict(s) for s in conn.execute(
                sa.select(db.shards).where(db.shards.c.dataset_id == r["id"]).order_by(db.shards.c.path)).mappings()]
    return rows


def update_dataset_info(ds_id: str, info: dict) -> None:
    """Merge keys into a dataset's `info` (e.g. counts measured after registration)."""
    with db.engine().begin() as conn:
        old = conn.execute(sa.select(db.datasets.c.info).where(db.datasets.c.id == ds_id)).scalar()
        merged = (json.loads(old) if old else {}) | info
        conn.execute(sa.update(db.datasets).where(db.datasets.c.id == ds_id).values(info=db.dumps(merged)))


def list_datasets(kind: str | None = None, name: str | None = None) -> list[dict]:
    q = sa.select(db.datasets).order_by(db.datasets.c.created.desc())
    if kind:
        q = q.where(db.datasets.c.kind == kind)
    if name:
        q = q.where(db.datasets.c.name == name)
    with db.engine().connect() as conn:
        return [dict(r) for r in conn.execute(q).mappings()]


def get_dataset(name_or_id: str, kind: str | None = None) -> dict | None:
    """The newest dataset with this id or name (optionally of one kind), with its shards."""
    q = sa.select(db.datasets).where(sa.or_(db.datasets.c.id == name_or_id, db.datasets.c.name == name_or_id))
    if kind:
        q = q.where(db.datasets.c.kind == kind)
    with db.engine().connect() as conn:
        row = conn.execute(q.order_by(db.datasets.c.created.desc())).mappings().first()
        if row is None:
            return None
        out = dict(row)
        out["shards"] = [dict(s) for s in conn.execute(
            sa.select(db.shards).where(db.shards.c.dataset_id == row["id"])).mappings()]
        return out


# ---- reports and lineage ----------------------------------------------------------------------

def save_report(run_id: str, stage: str, report: dict) -> None:
    with db.engine().begin() as conn:
        conn.execute(sa.delete(db.reports).where(db.reports.c.run_id == run_id, db.reports.c.stage == stage))
        conn.execute(sa.insert(db.reports).values(run_id=run_id, stage=stage, report=db.dumps(report)))


def get_reports(run_id: str) -> dict[str, dict]:
    with db.engine().connect() as conn:
        rows = conn.execute(sa.select(db.reports).where(db.reports.c.run_id == run_id)).mappings()
        return {r["stage"]: json.loads(r["report"]) for r in rows}


def record_lineage(run_id: str, direction: str, items: Iterable[dict]) -> None:
    """items: dicts with path and optionally dataset_id, sha256."""
    rows = [{"run_id": run_id, "direction": direction, "path": i["path"],
             "dataset_id": i.get("dataset_id"), "sha256": i.get("sha256")} for i in items]
    if not rows:
        return
    with db.engine().begin() as conn:
        conn.execute(sa.delete(db.lineage).where(db.lineage.c.run_id == run_id, db.lineage.c.direction == direction))
        conn.execute(sa.insert(db.lineage), rows)


def get_lineage(run_id: str) -> list[dict]:
    with db.engine().connect() as conn:
        return [dict(r) for r in conn.execute(sa.select(db.lineage).where(db.lineage.c.run_id == run_id)).mappings()]


# ---- models -----------------------------------------------------------------------------------

def register_model(name: str, kind: str, path: str, config: dict | None = None, metrics: dict | None = None,
                   fingerprint: str | None = None, run_id: str | None = None) -> str:
    check_name(name, "model name")
    model_id = db.new_id(kind)
    with db.engine().begin() as conn:
        conn.execute(sa.insert(db.models).values(
            id=model_id, name=name, kind=kind, path=str(path), run_id=run_id,
            config=db.dumps(config or {}), metrics=db.dumps(metrics or {}),
            fingerprint=fingerprint, created=db.now(), files=db.dumps(model_files(path))))
    return model_id


HASHED_MODEL_FILE_BYTES = 1 << 30   # larger files (LLM weights) are checked by size only: hashing costs a load


def model_files(path: str | Path) -> dict[str, list]:
    """{path relative to the model (\"\" for a file model): [bytes, sha256 or None]} of a model as written."""
    p = Path(path)
    if p.is_file():
        items = [("", p)]
    elif p.is_dir():
        items = sorted((str(f.relative_to(p)), f) for f in p.rglob("*") if f.is_file())
    else:
        return {}
    out = {}
    for rel, f in items:
        size = f.stat().st_size
        out[rel] = [size, sha256_file(f) if size <= HASHED_MODEL_FILE_BYTES else None]
    return out


class ModelFileChanged(UserError):
    """A model file is not what quipu wrote."""


def verify_model_files(path: str | Path) -> None:
    """ModelFileChanged (naming the file) if a model the catalog registered at `path` differs in
    size or sha256 from what was recorded when quipu wrote it; models it did not write pass."""
    p = Path(path).resolve()
    with db.engine().connect() as conn:
        row = conn.execute(sa.select(db.models.c.files).where(db.models.c.path.in_([str(path), str(p)]))
                           .order_by(db.models.c.created.desc())).first()
    if row is None or not row.files:
        return
    for rel, (size, sha) in json.loads(row.files).items():
        f = p / rel if rel else p
        if not f.is_file():
            raise ModelFileChanged(f"model file {f} is missing (the catalog recorded it when quipu wrote the model)")
        if f.stat().st_size != size:
            raise ModelFileChanged(f"model file {f} has {f.stat().st_size:,} bytes, {size:,} when quipu wrote it: "
                                   "it was changed or cut short; retrain it or restore it")
        if sha is not None and sha256_file(f) != sha:
            raise ModelFileChanged(f"model file {f} is not the file quipu wrote (sha256 differs from the catalog's): "
                                   "retrain it or restore it")


def list_models(kind: str | None = None) -> list[dict]:
    q = sa.select(db.models).order_by(db.models.c.created.desc())
    if kind:
        q = q.where(db.models.c.kind == kind)
    with db.engine().connect() as conn:
        return [dict(r) for r in conn.execute(q).mappings()]


def model_kinds_at(path: str | Path) -> set[str]:
    """The kinds the catalog registered models at `path` as (empty: a model it never registered)."""
    p = Path(path).resolve()
    with db.engine().connect() as conn:
        rows = conn.execute(sa.select(db.models.c.kind).where(db.models.c.path.in_([str(path), str(p)]))).all()
    return {r.kind for r in rows}


def get_model(name_or_id: str | None, kind: str) -> dict | None:
    """A model of `kind` by id or name; the newest of that kind when `name_or_id` is None."""
    q = sa.select(db.models).where(db.models.c.kind == kind)
    if name_or_id:
        q = q.where(sa.or_(db.models.c.id == name_or_id, db.models.c.name == name_or_id))
    with db.engine().connect() as conn:
        row = conn.execute(q.order_by(db.models.c.created.desc())).mappings().first()
        return dict(row) if row else None


# ---- small key-value cache --------------------------------------------------------------------

def kv_get_many(namespace: str, keys: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with db.engine().connect() as conn:
        for i in range(0, len(keys), 500):
            chunk = keys[i:i + 500]
            for r in conn.execute(sa.select(db.kv).where(db.kv.c.namespace == namespace, db.kv.c.key.in_(chunk))).mappings():
                out[r["key"]] = json.loads(r["value"])
    return out


def kv_put_many(namespace: str, items: dict[str, Any]) -> None:
    if not items:
        return
    with db.engine().begin() as conn:
        keys = list(items)
        for i in range(0, len(keys), 500):
            conn.execute(sa.delete(db.kv).where(db.kv.c.namespace == namespace, db.kv.c.key.in_(keys[i:i + 500])))
        conn.execute(sa.insert(db.kv), [{"namespace": namespace, "key": k, "value": json.dumps(v)} for k, v in items.items()])


# ---- files seen by the watcher ----------------------------------------------------------------

def files_seen(location: str) -> dict[str, dict]:
    """What the watcher last recorded for each file under `location`: path -> size, mtime, checksum."""
    with db.engine().connect() as conn:
        rows = conn.execute(sa.select(db.files_seen).where(db.files_seen.c.location == location)).mappings()
        return {r["path"]: dict(r) for r in rows}


def mark_files_seen(location: str, items: Iterable[dict], run_id: str | None = None) -> None:
    """items: dicts with path, size, mtime and optionally checksum; a path seen before is replaced."""
    rows = [{"location": location, "path": i["path"], "size": i.get("size"), "mtime": i.get("mtime"),
             "checksum": i.get("checksum"), "first_seen": db.now(), "run_id": run_id} for i in items]
    if not rows:
        return
    with db.engine().begin() as conn:
        paths = [r["path"] for r in rows]
        for i in range(0, len(paths), 500):
            conn.execute(sa.delete(db.files_seen).where(db.files_seen.c.location == location,
                                                        db.files_seen.c.path.in_(paths[i:i + 500])))
        conn.execute(sa.insert(db.files_seen), rows)


# ---- files announced by the watcher, waiting for the curate run that takes them -----------------

def files_pending(location: str | None = None) -> list[dict]:
    q = sa.select(db.files_pending)
    if location is not None:
        q = q.where(db.files_pending.c.location == location)
    with db.engine().connect() as conn:
        return [dict(r) for r in conn.execute(q.order_by(db.files_pending.c.path)).mappings()]


def add_files_pending(location: str, items: Iterable[dict], event_id: str, output: str) -> None:
    """items: dicts with path, size, mtime, checksum; a path already pending is replaced (attempts + 1
    when it is unchanged)."""
    items = list(items)
    if not items:
        return
    t = db.files_pending
    with db.engine().begin() as conn:
        paths = [i["path"] for i in items]
        attempts: dict[str, int] = {}
        for i in range(0, len(paths), 500):
            chunk = paths[i:i + 500]
            for r in conn.execute(sa.select(t.c.path, t.c.attempts, t.c.size, t.c.mtime)
                                  .where(t.c.location == location, t.c.path.in_(chunk))):
                attempts[r.path] = (r.attempts or 0, r.size, r.mtime)
            conn.execute(sa.delete(t).where(t.c.location == location, t.c.path.in_(chunk)))
        conn.execute(sa.insert(t), [{"location": location, "path": i["path"], "size": i.get("size"),
                                     "mtime": i.get("mtime"), "checksum": i.get("checksum"), "event_id": event_id,
                                     "output": output, "announced": db.now(), "attempts": _attempt(attempts.get(i["path"]), i)}
                                    for i in items])


def _attempt(before: tuple | None, item: dict) -> int:
    """1 for a file not tried before or changed since; else one more than before."""
    if before is None or before[1] != item.get("size") or abs((before[2] or 0.0) - (item.get("mtime") or 0.0)) > 1e-6:
        return 1
    return before[0] + 1


def drop_files_pending(location: str, paths: Iterable[str]) -> None:
    paths = list(paths)
    with db.engine().begin() as conn:
        for i in range(0, len(paths), 500):
            conn.execute(sa.delete(db.files_pending).where(db.files_pending.c.location == location,
                                                           db.files_pending.c.path.in_(paths[i:i + 500])))


def requeue_files_pending(location: str, paths: Iterable[str]) -> None:
    """Pending files whose curate run failed: no longer waiting on a run (announced again), their
    attempts kept."""
    paths = list(paths)
    with db.engine().begin() as conn:
        for i in range(0, len(paths), 500):
            conn.execute(sa.update(db.files_pending).where(
                db.files_pending.c.location == location, db.files_pending.c.path.in_(paths[i:i + 500]))
                .values(output="", event_id=None))
