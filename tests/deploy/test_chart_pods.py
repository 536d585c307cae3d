"""What every pod of the chart shares: the release's ServiceAccount without a mounted token, and
topologySpreadConstraints for brokers and nameservers (a list passed through, or a preset)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.chart import (
    RELEASE,
    Rendered,
    broker_sets,
    helm_binary,
    of_kind,
    render,
    render_error,
)

pytestmark = [
    pytest.mark.deploy,
    pytest.mark.skipif(helm_binary() is None, reason="helm is not installed: run `make tools`"),
]

FULLNAME = f"{RELEASE}-tidemq"


def _pod_specs(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod template, and the `helm test` pod, by the object's kind and name."""
    specs = {
        f"{o['kind']}/{o['metadata']['name']}": o["spec"]["template"]["spec"]
        for o in objects
        if o["kind"] in ("Deployment", "StatefulSet")
    }
    specs.update({f"Pod/{o['metadata']['name']}": o["spec"] for o in objects if o["kind"] == "Pod"})
    return specs


def test_every_pod_runs_as_the_releases_service_account_without_a_token(
    rendered: Rendered,
) -> None:
    values, objects, _ = rendered
    sa = values.get("serviceAccount", {})
    expected = sa.get("name") or (FULLNAME if sa.get("create", True) else "default")
    accounts = of_kind(objects, "ServiceAccount")
    if sa.get("create", True):
        assert list(accounts) == [expected]
        assert accounts[expected]["automountServiceAccountToken"] is False
        annotations = accounts[expected]["metadata"].get("annotations", {})
        assert sa.get("annotations", {}).items() <= annotations.items()
    else:
        assert not accounts
    specs = _pod_specs(objects)
    components = {"nameserver", "broker", "test"}
    if values.get("zookeeper", {}).get("enabled", True):
        components.add("zookeeper")
    if values.get("console", {}).get("enabled"):
        components.add("console")
    seen = set()
    for o in objects:
        if o["kind"] in ("Deployment", "StatefulSet", "Pod"):
            seen.add(o["metadata"]["labels"]["app.kubernetes.io/component"])
    assert seen == components
    for name, spec in specs.items():
        assert spec["serviceAccountName"] == expected, name
        assert spec["automountServiceAccountToken"] is False, name


def test_a_token_is_mounted_only_when_asked_for() -> None:
    objects = render({"serviceAccount": {"automountServiceAccountToken": True}})
    assert of_kind(objects, "ServiceAccount")[FULLNAME]["automountServiceAccountToken"] is True
    assert all(s["automountServiceAccountToken"] is True for s in _pod_specs(objects).values())


def test_topology_spread_preset_and_constraints(rendered: Rendered) -> None:
    values, objects, _ = rendered
    for component in ("nameserver", "broker"):
        own = values.get(component, {})
        workloads = (
            broker_sets(objects).values()
            if component == "broker"
            else [of_kind(objects, "Deployment")[f"{FULLNAME}-nameserver"]]
        )
        for w in workloads:
            spec = w["spec"]["template"]["spec"]
            constraints = spec.get("topologySpreadConstraints")
            if own.get("topologySpreadConstraints"):
                assert constraints == own["topologySpreadConstraints"]  # passed through
            elif own.get("topologySpreadPreset"):
                (c,) = constraints
                key = {"zone": "topology.kubernetes.io/zone", "hostname": "kubernetes.io/hostname"}
                assert c["topologyKey"] == key[own["topologySpreadPreset"]]
                assert c["whenUnsatisfiable"] == "ScheduleAnyway"
                # A broker group's own pods, as the anti-affinity preset selects them.
                assert c["labelSelector"]["matchLabels"] == w["spec"]["selector"]["matchLabels"]
            else:
                assert constraints is None


def test_the_hostname_preset_for_nameservers() -> None:
    objects = render({"nameserver": {"topologySpreadPreset": "hostname"}})
    ns = of_kind(objects, "Deployment")[f"{FULLNAME}-nameserver"]
    (c,) = ns["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert c["topologyKey"] == "kubernetes.io/hostname"
    assert c["labelSelector"]["matchLabels"] == ns["spec"]["selector"]["matchLabels"]


def test_a_service_account_name_that_is_no_dns_name_is_refused() -> None:
    assert "serviceAccount.name: Does not match pattern" in render_error(
        {"serviceAccount": {"name": "Tide_MQ"}}
    )
