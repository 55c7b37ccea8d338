"""Open an SQL database (any SQLAlchemy URL) as an Optuna RDB storage with heartbeats.

SQLite is the embedded default and fits one process on one machine. Several drivers or machines on
one study need PostgreSQL or MySQL: SQLite serialises every write behind one file lock and Optuna's
own docs warn against it under concurrency.
"""

from __future__ import annotations

import logging
import os
import random
import re
import sqlite3
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import optuna
import sqlalchemy
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    ArgumentError,
    DBAPIError,
    IntegrityError,
    InterfaceError,
    NoSuchModuleError,
    OperationalError,
    ProgrammingError,
)

DEFAULT_URL = "sqlite:///dimr.db"
HEARTBEAT_S = 10
GRACE_S = 30


RETRY_S = float(os.environ.get("DIMR_DB_RETRY_S", "60"))  # how long a lost database is waited for
_T = TypeVar("_T")


# psycopg warns that it could not end a pipeline on a connection already lost ("error ignored terminating
# <psycopg.Pipeline [BAD]>: the connection is lost", when a statement in a pipeline fails and ending the pipeline
# fails too): the command reports the lost database itself, in one line, and this warning had made that two.
logging.getLogger("psycopg").addFilter(lambda record: not str(record.msg).startswith("error ignored terminating"))


class StorageError(ValueError):
    """The storage URL is malformed or the database cannot be reached."""


class StorageLost(StorageError):
    """The database went away (longer than `RETRY_S`) or refuses writes (read-only, full disk)."""


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, even when it does not parse."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - malformed: mask by pattern
        return re.sub(r"(://[^:/@\s]*:)[^@\s]*@", r"\1***@", url)


_PERMANENT = ("readonly", "read-only", "read only", "disk is full", "no space", "disk full", "not a database",
              "unable to open database", "disk i/o error")


def fault_of(error: BaseException) -> tuple[str, str] | None:
    """("transient" | "permanent", first line of the database's message) if ``error`` (or what it wraps, e.g.
    Optuna's StorageInternalError) is a database fault; None for anything else. Transient: the connection was
    lost or refused, or SQLite is locked. Permanent: the database refuses writes (read-only, full disk)."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        orig = getattr(e, "orig", None) if isinstance(e, DBAPIError) else e
        text = str(orig if orig is not None else e).strip()
        first = text.splitlines()[0] if text else type(orig or e).__name__
        if any(p in text.lower() for p in _PERMANENT) and isinstance(e, (DBAPIError, sqlite3.Error)):
            return "permanent", first
        lost = isinstance(e, DBAPIError) and e.connection_invalidated
        if lost or isinstance(e, (OperationalError, InterfaceError)):
            return "transient", first
        e = e.__cause__ or e.__context__
    return None


def retrying(fn: Callable[..., _T], *args, budget_s: float | None = None, **kwargs) -> _T:
    """``fn(*args, **kwargs)``, called again with backoff (0.5 s doubling to 5 s) while it fails with a transient
    database fault, for at most ``budget_s`` (default `RETRY_S`). Then, or at once for a permanent fault,
    `StorageLost` with one line. ``fn`` must be safe to call again after a failure (a rolled-back transaction)."""
    budget = RETRY_S if budget_s is None else budget_s
    deadline, delay = None, 0.5
    while True:
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - classified below; anything else is re-raised as it is
            fault = fault_of(e)
            if fault is None:
                raise
            kind, why = fault
            if kind == "permanent":
                raise StorageLost(f"the database refuses writes ({why}); free disk space or make it writable, "
                                  "then run the same command again to resume") from None
            now = time.monotonic()
            deadline = deadline or now + budget
            if now >= deadline:
                raise StorageLost(f"lost the database for {budget:.0f} s ({why}); check that the server runs, "
                                  "then run the same command again to resume") from None
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, 5.0)


def _engine_kwargs(url: URL) -> dict:
    if url.get_backend_name() == "sqlite":
        return {"connect_args": {"timeout": 60}}
    return {"pool_pre_ping": True, "pool_size": 4, "max_overflow": 8}


def reader(engine: sqlalchemy.Engine) -> sqlalchemy.Engine:
    """``engine`` for reads of one statement: autocommit on PostgreSQL, where psycopg otherwise sends a BEGIN
    and a ROLLBACK, each a round trip, around every read. Elsewhere ``engine`` itself: pysqlite opens no
    transaction for a SELECT, and MySQL's autocommit switch would be a round trip of its own."""
    return engine.execution_options(isolation_level="AUTOCOMMIT") if engine.dialect.name == "postgresql" else engine


def validate_url(url: str, create: bool = True) -> URL:
    """Parse and probe ``url`` without creating anything. Raises StorageError with a one-line reason (the
    password masked). ``create=False`` (read-only commands): the database must already hold Optuna's tables."""
    shown = mask_url(url)
    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018 - a port that is not a number raises here
    except (ArgumentError, ValueError):
        raise StorageError(f"storage URL {shown!r} is malformed; use e.g. sqlite:///dimr.db or "
                           "postgresql+psycopg://user@host:5432/db") from None
    if parsed.get_backend_name() == "sqlite":
        _check_sqlite_file(parsed, shown, create)
        if create or not parsed.database or parsed.database == ":memory:":
            return parsed
    try:
        engine = sqlalchemy.create_engine(parsed, **_engine_kwargs(parsed))
    except (ArgumentError, NoSuchModuleError, ImportError, TypeError, ValueError) as e:
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StorageError(f"storage URL {shown!r} cannot be used ({why.replace(url, shown)}); "
                           "check the driver name, e.g. postgresql+psycopg or mysql+pymysql") from None
    try:
        with engine.connect() as c:
            tables = None if create else sqlalchemy.inspect(c).has_table("studies")
    except Exception as e:  # noqa: BLE001 - every DBAPI has its own error type
        first = str(getattr(e, "orig", e)).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise StorageError(f"cannot reach storage {shown} ({first}); "
                           "check that the server runs and the URL is right") from None
    finally:
        engine.dispose()
    if tables is False:
        raise StorageError(f"storage {shown} holds no studies (no Optuna tables); check --storage")
    return parsed


def _check_sqlite_file(parsed: URL, shown: str, create: bool) -> None:
    db = parsed.database
    if not db or db == ":memory:" or db.startswith("file:"):
        return
    path = Path(db)
    if path.is_dir():
        raise StorageError(f"storage URL {shown!r}: {path} is a directory; give a database file, e.g. {path}/dimr.db")
    if path.exists():
        try:
            with open(path, "rb") as f:
                head = f.read(16)
        except OSError as e:
            raise StorageError(f"storage URL {shown!r}: cannot read {path} ({e.strerror}); check its permissions"
                               ) from None
        if head and head != b"SQLite format 3\0":
            raise StorageError(f"storage URL {shown!r}: {path} is not an SQLite database; give another file")
        return
    if not create:
        raise StorageError(f"storage URL {shown!r}: {path} does not exist; check the path (this command "
                           "creates nothing)")
    if not path.parent.resolve().is_dir():
        raise StorageError(f"storage URL {shown!r}: directory {path.parent} does not exist; create it")


def open_storage(url: str = DEFAULT_URL, heartbeat: bool = True, create: bool = True) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage on ``url``; creates tables on first use. Heartbeats fail dead drivers' trials.
    ``create=False``: an existing dimr database only, and nothing is created (for read-only commands)."""
    parsed = validate_url(url, create)
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
        except Exception as e:  # noqa: BLE001 - a database fault (read-only, full disk): one line
            fault = fault_of(e)
            if fault is None:
                raise
            raise StorageError(f"cannot open storage {mask_url(url)} ({fault[1]}); check that it is writable "
                               "and its disk has space") from None
    raise AssertionError("unreachable")
