"""externalAccess (Bitnami Kafka's shape): a Service per broker pod, and each broker advertising
that Service's address, read by the broker from its own broker.toml; the certificate covering
those addresses; and the values that cannot work refused, all at once."""

from __future__ import annotations

import base64
import dataclasses
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.chart import (
    RELEASE,
    Rendered,
    broker_sets,
    container,
    helm_binary,
    of_kind,
    pod_flags,
    render,
    render_error,
    render_notes,
)
from tests.deploy.conftest import VALUE_SETS
from tidemq import cli
from tidemq.services.broker import config as broker_config

pytestmark = [
    pytest.mark.deploy,
    pytest.mark.skipif(helm_binary() is None, reason="helm is not installed: run `make tools`"),
]

FULLNAME = f"{RELEASE}-tidemq"
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"


def _pods(values: dict[str, Any]) -> list[str]:
    """Broker pods in the order of the per-broker lists: broker-a-0, broker-a-1, ..., broker-b-0."""
    broker = values.get("broker", {})
    return [
        f"{FULLNAME}-broker-{chr(97 + g)}-{o}"
        for g in range(broker.get("groups", 1))
        for o in range(1 + broker.get("slavesPerGroup", 1))
    ]


def _expected(values: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """What each pod must advertise: (gRPC address, RocketMQ 5 address)."""
    s = values["externalAccess"]["service"]
    out = {}
    for i, pod in enumerate(_pods(values)):
        if s.get("type") == "NodePort":
            out[pod] = (
                f"{s['domain']}:{s['nodePorts'][i]}",
                f"{s['domain']}:{s['rocketmqNodePorts'][i]}",
            )
        else:
            host = (s.get("loadBalancerNames") or s["loadBalancerIPs"])[i]
            out[pod] = (f"{host}:10911", f"{host}:8081")
    return out


def test_each_broker_advertises_its_own_external_service(rendered: Rendered) -> None:
    """The broker's own config (entrypoint, its pod's broker.toml, flags) names its Service's
    address, and that Service selects that pod alone, on the ports the broker listens on."""
    values, objects, toml = rendered
    services = of_kind(objects, "Service")
    external = {n: s for n, s in services.items() if n.endswith("-external")}
    if not values.get("externalAccess", {}).get("enabled"):
        assert not external
        for sts in broker_sets(objects).values():
            assert "/etc/tidemq/$(POD_NAME).toml" not in container(sts)["args"]
        return
    s = values["externalAccess"]["service"]
    expected = _expected(values)
    assert sorted(external) == sorted(f"{pod}-external" for pod in expected)
    keys = {f.name for f in dataclasses.fields(broker_config.BrokerConfig)}
    for sts in broker_sets(objects).values():
        named = {p["name"]: p["containerPort"] for p in container(sts)["ports"]}
        for ordinal in range(sts["spec"]["replicas"]):
            pod = f"{sts['metadata']['name']}-{ordinal}"
            args = pod_flags(sts, ordinal, toml)
            assert "--advertise" not in args and "--rocketmq-advertise" not in args
            parsed = vars(cli.build_parser().parse_args(args))
            own = toml.parent / f"{pod}.toml"
            assert parsed["config"] == str(own)
            cfg = broker_config.load(str(own), {k: parsed[k] for k in keys if k in parsed})
            assert (cfg.advertised, cfg.rocketmq_advertised) == expected[pod]
            assert cfg.listen == f"0.0.0.0:{named['grpc']}"  # the rest is broker.toml's

            svc = external[f"{pod}-external"]
            spec = svc["spec"]
            assert spec["type"] == s.get("type", "LoadBalancer")
            assert spec["selector"][POD_NAME_LABEL] == pod
            rest = {k: v for k, v in spec["selector"].items() if k != POD_NAME_LABEL}
            assert rest.items() <= sts["spec"]["selector"]["matchLabels"].items()
            assert spec["publishNotReadyAddresses"] is True
            ports = {p["name"]: p for p in spec["ports"]}
            assert {p["targetPort"] for p in ports.values()} == {"grpc", "rocketmq"}
            i = _pods(values).index(pod)
            if spec["type"] == "NodePort":
                assert ports["grpc"]["nodePort"] == s["nodePorts"][i]
                assert ports["rocketmq"]["nodePort"] == s["rocketmqNodePorts"][i]
                assert "loadBalancerIP" not in spec
            else:
                assert spec["loadBalancerIP"] == s["loadBalancerIPs"][i]
                assert spec["loadBalancerSourceRanges"] == s["loadBalancerSourceRanges"]
                assert ports["grpc"]["port"] == 10911 and ports["rocketmq"]["port"] == 8081
                assert svc["metadata"]["annotations"] == s["annotations"]


def test_the_chart_made_certificate_covers_the_external_addresses(tmp_path: Path) -> None:
    for name in ("external-load-balancer-spread", "external-node-port-mutual-tls"):
        values = VALUE_SETS[name]
        objects = render(values)
        secret = of_kind(objects, "Secret")[f"{FULLNAME}-tls"]
        crt = tmp_path / f"{name}.crt"
        crt.write_bytes(base64.b64decode(secret["data"]["tls.crt"]))
        sans = subprocess.run(
            ["openssl", "x509", "-in", str(crt), "-noout", "-ext", "subjectAltName"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        for grpc, _ in _expected(values).values():
            host = grpc.rpartition(":")[0]
            assert f"DNS:{host}" in sans, (name, host)
        for ip in values["externalAccess"]["service"].get("loadBalancerIPs", []):
            assert f"IP Address:{ip}" in sans
        for extra in values.get("tls", {}).get("extraDnsNames", []):
            assert f"DNS:{extra}" in sans
        assert "IP Address:127.0.0.1" in sans


def test_new_ip_addresses_get_the_certificate_issued_again() -> None:
    """The checksum of the names the certificate covers counts the IP addresses as well, so a
    release given external IPs gets a certificate covering them on upgrade."""
    default = of_kind(render({}), "Secret")[f"{FULLNAME}-tls"]
    with_ips = of_kind(render({"tls": {"extraIpAddresses": ["192.0.2.1"]}}), "Secret")
    assert (
        default["metadata"]["annotations"]["tidemq.io/names"]
        != with_ips[f"{FULLNAME}-tls"]["metadata"]["annotations"]["tidemq.io/names"]
    )


def test_the_notes_list_each_brokers_external_address() -> None:
    values = VALUE_SETS["external-node-port-mutual-tls"]
    notes = render_notes(values)
    for pod, (grpc, rocketmq) in _expected(values).items():
        assert f"{pod}-external: {grpc} (RocketMQ 5: {rocketmq})" in notes
    assert "nameserver.service.type" in notes
    assert "External access" not in render_notes({})


def _lb(**service: Any) -> dict[str, Any]:
    return {"externalAccess": {"enabled": True, "service": service}}


def _np(**service: Any) -> dict[str, Any]:
    return {"externalAccess": {"enabled": True, "service": {"type": "NodePort", **service}}}


ORDER = f"2 broker pods, in this order: {FULLNAME}-broker-a-0, {FULLNAME}-broker-a-1"


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            _lb(),
            "externalAccess.service: type LoadBalancer needs the address each broker advertises:"
            f" loadBalancerIPs or loadBalancerNames, {ORDER}",
        ),
        (
            _lb(loadBalancerIPs=["203.0.113.1"]),
            f"externalAccess.service.loadBalancerIPs: one per broker pod: {ORDER}; got 1",
        ),
        (
            _lb(loadBalancerIPs=["203.0.113.1", "203.0.113.2"], loadBalancerNames=["a.example"]),
            "externalAccess.service.loadBalancerNames: one per broker pod",
        ),
        (
            _lb(loadBalancerNames=["a.example", "a.example"]),
            "externalAccess.service: two brokers would advertise the same address:"
            " a.example:10911, a.example:10911",
        ),
        (
            _np(nodePorts=[31000, 31001], rocketmqNodePorts=[31002, 31003]),
            "externalAccess.service.domain: required with type NodePort",
        ),
        (
            _np(domain="n.example", nodePorts=[31000], rocketmqNodePorts=[31002, 31003]),
            f"externalAccess.service.nodePorts: one node port per broker pod: {ORDER}; got 1",
        ),
        (
            _np(domain="n.example", nodePorts=[31000, 31001]),
            "externalAccess.service.rocketmqNodePorts: one node port per broker pod",
        ),
        (
            _np(domain="n.example", nodePorts=[8080, 31001], rocketmqNodePorts=[31002, 40000]),
            "externalAccess.service.nodePorts: 8080 is outside the node port range 30000-32767",
        ),
        (
            _np(domain="n.example", nodePorts=[31000, 31001], rocketmqNodePorts=[31001, 31003]),
            "externalAccess.service.nodePorts and rocketmqNodePorts:"
            " every node port must be different",
        ),
        (
            {
                "externalAccess": {
                    "enabled": True,
                    "autoDiscovery": {"enabled": True},
                    "service": {"loadBalancerIPs": ["203.0.113.1", "203.0.113.2"]},
                }
            },
            "externalAccess.autoDiscovery.enabled: not supported",
        ),
    ],
)
def test_external_access_values_that_cannot_work_are_refused(
    values: dict[str, Any], expected: str
) -> None:
    error = render_error(values)
    assert "VALUES VALIDATION" in error
    assert expected in error


def test_every_external_problem_is_listed_at_once() -> None:
    error = render_error(_np(nodePorts=[1], nodePortRange="30000-32767"))
    assert error.count("VALUES VALIDATION") == 1
    for expected in (
        "externalAccess.service.domain: required",
        "externalAccess.service.nodePorts: one node port per broker pod",
        "externalAccess.service.nodePorts: 1 is outside the node port range",
        "externalAccess.service.rocketmqNodePorts: one node port per broker pod",
    ):
        assert expected in error


def test_a_cluster_with_another_node_port_range_and_rocketmq_off(tmp_path: Path) -> None:
    values = _np(domain="192.0.2.10", nodePorts=[20001, 20002], nodePortRange="20000-20100")
    values["broker"] = {"rocketmq": {"enabled": False}}
    objects = render(values)
    for i, pod in enumerate(_pods(values)):
        spec = of_kind(objects, "Service")[f"{pod}-external"]["spec"]
        assert [(p["name"], p["nodePort"]) for p in spec["ports"]] == [("grpc", 20001 + i)]
        toml = of_kind(objects, "ConfigMap")[f"{FULLNAME}-broker"]["data"][f"{pod}.toml"]
        assert f'advertise = "192.0.2.10:{20001 + i}"' in toml
        assert "rocketmq_advertise" not in toml
    # A domain that is an IP address is an IP SAN of the certificate, not a DNS name.
    crt = tmp_path / "tls.crt"
    crt.write_bytes(
        base64.b64decode(of_kind(objects, "Secret")[f"{FULLNAME}-tls"]["data"]["tls.crt"])
    )
    sans = subprocess.run(
        ["openssl", "x509", "-in", str(crt), "-noout", "-ext", "subjectAltName"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "IP Address:192.0.2.10" in sans
    assert "DNS:192.0.2.10" not in sans
