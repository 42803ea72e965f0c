"""The catalog database: SQLite by default, any SQLAlchemy URL (e.g. Postgres) by setting.

Location: `QUIPU_CATALOG_URL` if set, else `sqlite:///$QUIPU_HOME/catalog.db` with `QUIPU_HOME`
defaulting to `~/.quipu`. Tables are created on first use. SQLAlchemy Core keeps the SQL portable.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from quipu.catalog.errors import UserError

metadata = sa.MetaData()

runs = sa.Table(
    "runs", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("flow", sa.String(64), nullable=False),
    sa.Column("output", sa.Text),
    sa.Column("config", sa.Text),            # JSON
    sa.Column("config_hash", sa.String(64)),
    sa.Column("status", sa.String(16)),      # running | completed | failed | crashed
    sa.Column("started", sa.DateTime),
    sa.Column("ended", sa.DateTime),
    sa.Column("summary", sa.Text),           # JSON: run.json of a curate run, metrics of a train run
    sa.Column("owner", sa.String(256)),      # host:pid:start of the process running it (processes.process_owner)
)

datasets = sa.Table(
    "datasets", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(256), nullable=False),
    sa.Column("kind", sa.String(32)),        # curated | stage-kept | stage-removed | quarantine | tokens | ...
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("run_id", sa.String(64)),
    sa.Column("rows", sa.BigInteger),
    sa.Column("bytes", sa.BigInteger),
    sa.Column("created", sa.DateTime),
    sa.Column("info", sa.Text),              # JSON
    sa.Column("version", sa.Integer),        # curated datasets: 1, 2, ... one per curate run into the name
)

shards = sa.Table(
    "shards", metadata,
    sa.Column("dataset_id", sa.String(64), sa.ForeignKey("datasets.id"), nullable=False),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("rows", sa.BigInteger),
    sa.Column("bytes", sa.BigInteger),
    sa.Column("sha256", sa.String(64)),
)

reports = sa.Table(
    "reports", metadata,
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("stage", sa.String(64), nullable=False),
    sa.Column("report", sa.Text),            # JSON
)

lineage = sa.Table(
    "lineage", metadata,
    sa.Column("run_id", sa.String(64), nullable=False),
    sa.Column("direction", sa.String(8), nullable=False),  # input | output
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("dataset_id", sa.String(64)),
    sa.Column("sha256", sa.String(64)),
)

models = sa.Table(
    "models", metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(256), nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),   # quality-fasttext | kenlm | wayra | tokenizer | llm | ...
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("run_id", sa.String(64)),
    sa.Column("config", sa.Text),
    sa.Column("metrics", sa.Text),
    sa.Column("fingerprint", sa.String(64)),
    sa.Column("created", sa.DateTime),
    sa.Column("files", sa.Text),             # JSON {relative path: [bytes, sha256]} of what quipu wrote
)

files_seen = sa.Table(
    "files_seen", metadata,
    sa.Column("location", sa.Text, nullable=False),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("size", sa.BigInteger),
    sa.Column("mtime", sa.Float),
    sa.Column("checksum", sa.String(64)),
    sa.Column("first_seen", sa.DateTime),
    sa.Column("run_id", sa.String(64)),
)

files_pending = sa.Table(  # announced by the watcher, not yet curated by a completed run
    "files_pending", metadata,
    sa.Column("location", sa.Text, nullable=False),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("size", sa.BigInteger),
    sa.Column("mtime", sa.Float),
    sa.Column("checksum", sa.String(64)),
    sa.Column("event_id", sa.String(64)),
    sa.Column("output", sa.Text),            # the curate run directory the event asked for
    sa.Column("announced", sa.DateTime),
    sa.Column("attempts", sa.Integer),
)

kv = sa.Table(  # small caches keyed by a hash (e.g. teacher perplexity labels)
    "kv", metadata,
    sa.Column("namespace", sa.String(64), primary_key=True),
    sa.Column("key", sa.String(128), primary_key=True),
    sa.Column("value", sa.Text),
)


def quipu_home() -> Path:
    return Path(os.environ.get("QUIPU_HOME", Path.home() / ".quipu"))


def cache_home() -> Path:
    """Where rebuildable caches live (the URL blocklist's hashes, benchmark indexes, SmolLM2's
    tokenizer.json): `QUIPU_CACHE` if set, else $QUIPU_HOME/cache. Catalogs can share one."""
    return Path(os.environ.get("QUIPU_CACHE") or quipu_home() / "cache")


def catalog_url() -> str:
    url = os.environ.get("QUIPU_CATALOG_URL")
    if url:
        return url
    home = quipu_home()
    home.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{home / 'catalog.db'}"


class CatalogUnreadable(UserError):
    """The catalog database cannot be opened or is not one."""


@lru_cache(maxsize=8)
def _engine_for(url: str) -> sa.Engine:
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        # Several Prefect task threads register into one file: wait rather than fail on a lock.
        kwargs["connect_args"] = {"timeout": 60, "check_same_thread": False}
    engine = sa.create_engine(url, future=True, **kwargs)
    try:
        if url.startswith("sqlite:///"):
            with engine.connect() as conn:   # a truncated file can pass create_all and fail mid-run
                bad = [r[0] for r in conn.exec_driver_sql("PRAGMA quick_check(3)")]
            if bad != ["ok"]:     # SQLite's findings, one line (its rows hold newlines)
                raise CatalogUnreadable(unreadable_message(url, "; ".join(
                    line for row in bad for line in str(row).splitlines() if not line.startswith("***"))))
        metadata.create_all(engine)
        add_missing_columns(engine)
    except sa.exc.DBAPIError as e:
        raise CatalogUnreadable(unreadable_message(url, str(e.orig).splitlines()[0] if e.orig else str(e))) from None
    return engine


def unreadable_message(url: str, why: str) -> str:
    where = url.removeprefix("sqlite:///")
    fix = (f"move it away (a new catalog is created on the next run) or set QUIPU_CATALOG_URL"
           if url.startswith("sqlite:///") else "check QUIPU_CATALOG_URL and the database server")
    if url.startswith("sqlite:///") and Path(where).is_dir():
        why = "it is a directory, not a database file"
    return f"catalog database {where} is unreadable ({why}): {fix}"


def add_missing_columns(engine: sa.Engine) -> None:
    """Columns added to a table after a catalog was created (create_all only creates tables)."""
    inspector = sa.inspect(engine)
    for table in metadata.sorted_tables:
        have = {c["name"] for c in inspector.get_columns(table.name)}
        for col in table.columns:
            if col.name not in have:
                kind = col.type.compile(dialect=engine.dialect)
                try:
                    with engine.begin() as conn:
                        conn.execute(sa.text(f"ALTER TABLE {table.name} ADD COLUMN {col.name} {kind}"))
                except sa.exc.DBAPIError:   # another process added it first
                    if col.name not in {c["name"] for c in sa.inspect(engine).get_columns(table.name)}:
                        raise


def engine() -> sa.Engine:
    return _engine_for(catalog_url())


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


def new_id(prefix: str) -> str:
    return f"{prefix}-{now():%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str)
