"""Real containers through testcontainers (tidemq.testing), on the engine docker/with-engine.sh
sets up: `make test` runs this suite with it.

Without an engine the suite skips, saying why: docker/with-engine.sh's reason when it could not
set one up (TIDEMQ_CONTAINERS_UNAVAILABLE), or that no DOCKER_HOST was given (pytest run by
hand; run it as `bash docker/with-engine.sh .venv/bin/python -m pytest tests/containers`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tidemq.testing import TidemqCluster

UNAVAILABLE = os.environ.get("TIDEMQ_CONTAINERS_UNAVAILABLE")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    reason = None
    if UNAVAILABLE:
        reason = f"no container engine: {UNAVAILABLE}"
    elif not os.environ.get("DOCKER_HOST"):
        reason = "no DOCKER_HOST: run through docker/with-engine.sh (make test does)"
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.containers)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


MakeCluster = Callable[..., TidemqCluster]


@pytest.fixture
def make_cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[MakeCluster]:
    """Start clusters; all are removed at the end, and a failed test prints their logs."""
    clusters: list[TidemqCluster] = []
    failed_before = request.session.testsfailed

    def make(**kwargs: Any) -> TidemqCluster:
        cluster = TidemqCluster(logs_dir=tmp_path / f"logs-{len(clusters)}", **kwargs)
        clusters.append(cluster)
        return cluster.start()

    yield make
    # The call phase's report is counted before fixtures are torn down.
    failed = request.session.testsfailed > failed_before
    for cluster in clusters:
        if failed:
            for path in cluster.dump_logs(cluster.logs_dir or tmp_path):
                print(f"----- {path.name} -----\n{path.read_text()[-20000:]}")
        cluster.close()
