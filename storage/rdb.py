"""Open an SQL database (any SQLAlchemy URL) as an Optuna RDB storage with heartbeats.

SQLite is the embedded default and fits one process on one machine. Several drivers or machines on
one study need PostgreSQL or MySQL: SQLite serialises every write behind one file lock and Optuna's
own docs warn against it under concurrency.
"""

from __future__ import annotations

import random
import time
import warnings
from pathlib import Path

import optuna
import sqlalchemy
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, NoSuchModuleError, ProgrammingError

DEFAULT_URL = "sqlite:///dimr.db"
HEARTBEAT_S = 10
GRACE_S = 30


class StorageError(ValueError):
    """The storage URL is malformed or the database cannot be reached."""


def _engine_kwargs(url: URL) -> dict:
    if url.get_backend_name() == "sqlite":
        return {"connect_args": {"timeout": 60}}
    return {"pool_pre_ping": True, "pool_size": 4, "max_overflow": 8}


def reader(engine: sqlalchemy.Engine) -> sqlalchemy.Engine:
    """``engine`` for reads of one statement: autocommit on PostgreSQL, where psycopg otherwise sends a BEGIN
    and a ROLLBACK, each a round trip, around every read. Elsewhere ``engine`` itself: pysqlite opens no
    transaction for a SELECT, and MySQL's autocommit switch would be a round trip of its own."""
    return engine.execution_options(isolation_level="AUTOCOMMIT") if engine.dialect.name == "postgresql" else engine


def validate_url(url: str) -> URL:
    """Parse and probe ``url`` without creating anything. Raises StorageError with a one-line reason."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StorageError(f"storage URL {url!r} is malformed; use e.g. sqlite:///dimr.db or "
                           "postgresql+psycopg://user@host/db") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        db = parsed.database
        if db and db != ":memory:" and not Path(db).parent.resolve().is_dir():
            raise StorageError(f"storage URL {url!r}: directory {Path(db).parent} does not exist; create it")
        return parsed
    try:
        engine = sqlalchemy.create_engine(parsed, **_engine_kwargs(parsed))
    except (ArgumentError, NoSuchModuleError, ImportError) as e:
        raise StorageError(f"storage URL {url!r} cannot be used ({e}); check the driver name") from None
    try:
        with engine.connect():
            pass
    except Exception as e:  # noqa: BLE001 - every DBAPI has its own error type
        first = str(getattr(e, "orig", e)).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StorageError(f"cannot reach storage {parsed.render_as_string(hide_password=True)} ({first}); "
                           "check that the server runs and the URL is right") from None
    finally:
        engine.dispose()
    return parsed


def open_storage(url: str = DEFAULT_URL, heartbeat: bool = True) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage on ``url``; creates tables on first use. Heartbeats fail dead drivers' trials."""
    parsed = validate_url(url)
    kw = {"heartbeat_interval": HEARTBEAT_S, "grace_period": GRACE_S} if heartbeat else {}
    for attempt in range(3):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # relied on
                return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(parsed), **kw)
        except (IntegrityError, ProgrammingError):
            # Two drivers creating the tables of a new database at once: one loses; the tables exist now.
            if attempt == 2:
                raise
            time.sleep(0.5 + random.random())
    raise AssertionError("unreachable")
