"""Test-wide settings: offline hub, a private DIMR_HOME, few threads."""

import os
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("DIMR_HOME", tempfile.mkdtemp(prefix="dimr-home-"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)  # tiny models: one thread is ~4x faster than two on a 2-core box


@pytest.fixture(scope="session")
def tiny_pair():
    from dimr.pairs import get_pair

    return get_pair("tiny-random")


PG_ADMIN = os.environ.get("DIMR_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _no_server(what: str) -> None:
    """Skip a test whose database server is absent, with the reason; fail instead under DIMR_REQUIRE_DB=1 (CI)."""
    if os.environ.get("DIMR_REQUIRE_DB") == "1":
        pytest.fail(f"{what}; DIMR_REQUIRE_DB=1 requires it (start it, see docs/reliability.md)")
    pytest.skip(f"{what}; set DIMR_REQUIRE_DB=1 to make this a failure")


def _pg_available() -> bool:
    import sqlalchemy

    try:
        with sqlalchemy.create_engine(PG_ADMIN).connect():
            return True
    except Exception:  # noqa: BLE001
        return False


@pytest.fixture
def pg_url():
    """A fresh PostgreSQL database for one test, dropped afterwards."""
    import uuid

    import sqlalchemy

    if not _pg_available():
        _no_server(f"PostgreSQL is not reachable at {PG_ADMIN}")
    name = f"dimr_test_{uuid.uuid4().hex[:10]}"
    admin = sqlalchemy.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.exec_driver_sql(f'CREATE DATABASE "{name}"')
    yield PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    with admin.connect() as c:
        c.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def storage_url(request, tmp_path):
    """Every storage test runs on SQLite and on the local PostgreSQL server."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'dimr.db'}"
    else:
        yield request.getfixturevalue("pg_url")


MYSQL_ADMIN = os.environ.get("DIMR_TEST_MYSQL", "mysql+pymysql://root@127.0.0.1:3306/test")


@pytest.fixture
def mysql_url():
    """A fresh MariaDB/MySQL database for one test, dropped afterwards."""
    import uuid

    import sqlalchemy

    name = f"dimr_test_{uuid.uuid4().hex[:10]}"
    admin = sqlalchemy.create_engine(MYSQL_ADMIN)
    try:
        with admin.connect() as c:
            c.exec_driver_sql(f"CREATE DATABASE {name}")
    except Exception as e:  # noqa: BLE001
        _no_server(f"MariaDB is not reachable at {MYSQL_ADMIN} ({str(e).splitlines()[0]})")
    yield MYSQL_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    with admin.connect() as c:
        c.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
    admin.dispose()
