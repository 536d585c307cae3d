"""One image reference everywhere: what `make image` (docker/build-image.sh, named in
docker/lib.sh) builds is what the chart pulls by default and what tidemq.testing runs, and the
tag is the chart's appVersion, the package's version. Nothing is built here."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

import tidemq
from tests.deploy.chart import CHART, ROOT, container, helm_binary, of_kind, render
from tidemq.testing import config as testing_config

pytestmark = [pytest.mark.deploy]


def _app_version() -> str:
    version: str = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    return version


def _built_by_make_image(tmp_path: Path, **env: str) -> str:
    """TIDEMQ_IMAGE as docker/build-image.sh sees it (docker/lib.sh, sourced)."""
    done = subprocess.run(
        ["bash", "-c", 'source docker/lib.sh && printf %s "$TIDEMQ_IMAGE"'],
        cwd=ROOT, capture_output=True, text=True, check=True,
        env={"PATH": os.environ["PATH"], "TIDEMQ_CONTAINERS_STATE": str(tmp_path), **env},
    )  # fmt: skip
    return done.stdout


def test_make_image_builds_what_the_chart_pulls_by_default(tmp_path: Path) -> None:
    built = _built_by_make_image(tmp_path)
    assert built == f"ghcr.io/tidemq/tidemq:{_app_version()}"
    values = yaml.safe_load((CHART / "values.yaml").read_text())["image"]
    assert f"{values['registry']}/{values['repository']}:{_app_version()}" == built
    assert values["tag"] == ""  # the appVersion
    assert built == testing_config.DEFAULT_IMAGE
    # tests/containers run what `make image` built.
    assert 'TIDEMQ_TEST_IMAGE="$TIDEMQ_IMAGE"' in (ROOT / "docker" / "with-engine.sh").read_text()
    assert _built_by_make_image(tmp_path, TIDEMQ_IMAGE="registry.example/mq:dev") == (
        "registry.example/mq:dev"
    )


@pytest.mark.skipif(helm_binary() is None, reason="helm is not installed: run `make tools`")
def test_every_tidemq_container_runs_that_image(tmp_path: Path) -> None:
    built = _built_by_make_image(tmp_path)
    objects = render({"console": {"enabled": True}})
    workloads = [
        *of_kind(objects, "Deployment").values(),
        *of_kind(objects, "StatefulSet").values(),
    ]
    for w in workloads:
        if w["metadata"]["labels"]["app.kubernetes.io/component"] != "zookeeper":
            assert container(w)["image"] == built
    (pod,) = of_kind(objects, "Pod").values()
    assert {c["image"] for c in [*pod["spec"]["initContainers"], *pod["spec"]["containers"]]} == {
        built
    }
    pinned = render({"image": {"registry": "", "repository": "tidemq", "tag": "dev"}})
    ns = container(of_kind(pinned, "Deployment")["mq-tidemq-nameserver"])
    assert ns["image"] == "tidemq:dev"  # no registry: no leading slash


def test_the_versions_agree() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert _app_version() == pyproject["project"]["version"] == tidemq.__version__


def test_the_docs_say_how_to_push_it() -> None:
    for doc in ("README.md", "docs/deployment.md"):
        text = (ROOT / doc).read_text()
        assert "podman push ghcr.io/tidemq/tidemq:" in text, doc
