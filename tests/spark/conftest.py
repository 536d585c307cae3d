"""A real SparkSession (local[2], the tuned JVM flags of pipeline.session) shared by every Spark
test of the pytest process, and real nameserver and broker processes per test.

Skipped only when Java is missing: pyspark and pyarrow are installed by the venv
(`make venv` installs the ``spark`` extra), so their absence is an error, not a skip.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

# The integration fixtures: real processes, stopped by PID, logs printed when a test failed.
from tests.integration.conftest import (  # noqa: F401 - fixtures and the report hook
    pytest_runtest_makereport,
    start_broker,
    start_nameserver,
)
from tidemq.pipeline.session import get_session


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    if shutil.which("java") is None:
        pytest.fail(
            "Spark needs Java 17+ on PATH: `make system-deps` installs default-jre-headless",
            pytrace=False,
        )
    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = get_session(
        "tidemq-tests",
        "local[2]",
        **{
            "spark.sql.warehouse.dir": str(warehouse),
            "spark.sql.session.timeZone": "UTC",
        },
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def out_dir(tmp_path: Path) -> Path:
    d = tmp_path / "out"
    d.mkdir()
    return d
