"""helm/tidemq's RocketMQ 5 listener: on by default on every broker pod, advertised at its
stable DNS name, one Service in front of every broker as the official clients' endpoint,
printed by the NOTES; bad ports refused; off renders none of it."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.deploy.chart import (
    NAMESPACE,
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
    workloads_of,
)
from tidemq import cli
from tidemq.services.broker import config as broker_config

pytestmark = [
    pytest.mark.deploy,
    pytest.mark.skipif(helm_binary() is None, reason="helm is not installed: run `make tools`"),
]


def rocketmq_on(values: dict[str, Any]) -> bool:
    enabled: bool = values.get("broker", {}).get("rocketmq", {}).get("enabled", True)
    return enabled


def test_each_broker_serves_the_rocketmq_protocol_advertising_its_pod_dns_name(
    rendered: Rendered,
) -> None:
    """On by default: every pod listens on its ``rocketmq`` port and the routes name it at its
    stable DNS name, as the broker runs it (entrypoint, broker.toml, flags). Off: no listener,
    and the image's own default does not turn it on."""
    values, objects, toml = rendered
    if values.get("externalAccess", {}).get("enabled"):
        pytest.skip("brokers advertise their external Services: test_chart_external.py")
    domain = values.get("clusterDomain", "cluster.local")
    for sts in broker_sets(objects).values():
        named = {p["name"]: p["containerPort"] for p in container(sts)["ports"]}
        for ordinal in range(sts["spec"]["replicas"]):
            args = pod_flags(sts, ordinal, toml)
            pod = f"{sts['metadata']['name']}-{ordinal}"
            dns = f"{pod}.{sts['spec']['serviceName']}.{NAMESPACE}.svc.{domain}"
            for flag_name in ("--advertise", "--rocketmq-advertise"):
                if flag_name in args:  # what Kubernetes substitutes in the pod
                    i = args.index(flag_name) + 1
                    args[i] = (
                        args[i].replace("$(POD_NAME)", pod).replace("$(POD_NAMESPACE)", NAMESPACE)
                    )
            parsed = vars(cli.build_parser().parse_args(args))
            keys = {f.name for f in dataclasses.fields(broker_config.BrokerConfig)}
            cfg = broker_config.load(str(toml), {k: parsed[k] for k in keys if k in parsed})
            assert cfg.advertised == f"{dns}:{named['grpc']}"
            if rocketmq_on(values):
                port = values.get("broker", {}).get("containerPorts", {}).get("rocketmq", 8081)
                assert named["rocketmq"] == port
                assert cfg.rocketmq_listen == f"0.0.0.0:{port}"
                assert cfg.rocketmq_advertised == f"{dns}:{port}"
            else:
                assert "rocketmq" not in named
                assert "--rocketmq-advertise" not in args
                assert (cfg.rocketmq_listen, cfg.rocketmq_advertised) == ("", "")


def test_one_service_in_front_of_every_broker_is_the_rocketmq_clients_endpoint(
    rendered: Rendered,
) -> None:
    """``<fullname>-broker:<port>`` reaches the ready brokers of every group (any answers the
    routes of all); each group's headless Service names its pods' RocketMQ 5 port."""
    values, objects, _ = rendered
    services = of_kind(objects, "Service")
    sets = broker_sets(objects)
    if not rocketmq_on(values):
        assert f"{RELEASE}-tidemq-broker" not in services
        for sts in sets.values():
            ports = services[sts["spec"]["serviceName"]]["spec"]["ports"]
            assert "rocketmq" not in {p["name"] for p in ports}
        return
    service = values.get("broker", {}).get("service", {})
    svc = services[f"{RELEASE}-tidemq-broker"]
    assert svc["spec"]["type"] == service.get("type", "ClusterIP")
    assert not svc["spec"].get("publishNotReadyAddresses")  # a starting broker knows no routes
    (port,) = svc["spec"]["ports"]
    assert (port["name"], port["targetPort"], port["appProtocol"]) == ("rocketmq",) * 2 + ("grpc",)
    assert port["port"] == service.get("ports", {}).get("rocketmq", 8081)
    selected = [
        sts
        for sts in sets.values()
        if svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert selected == list(sets.values())  # every group's master and slaves
    assert not [
        w
        for w in workloads_of(objects)
        if w not in selected
        and svc["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()
    ]
    for sts in sets.values():
        headless = services[sts["spec"]["serviceName"]]["spec"]["ports"]
        assert "rocketmq" in {p["name"] for p in headless}


def test_notes_print_the_rocketmq_endpoint_only_when_it_is_on() -> None:
    notes = render_notes({})
    endpoint = f"{RELEASE}-tidemq-broker.{NAMESPACE}.svc.cluster.local:8081"
    assert f"endpoints = {endpoint}" in notes
    moved = render_notes({"broker": {"service": {"ports": {"rocketmq": 18081}}}})
    assert f"{RELEASE}-tidemq-broker.{NAMESPACE}.svc.cluster.local:18081" in moved
    off = render_notes({"broker": {"rocketmq": {"enabled": False}}})
    assert "RocketMQ" not in off
    assert f"{RELEASE}-tidemq-nameserver:9876" in off  # the rest is still printed


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (  # values.schema.json: ports are 1 to 65535
            {"broker": {"containerPorts": {"rocketmq": 70000}}},
            "broker.containerPorts.rocketmq: Must be less than or equal to 65535",
        ),
        (
            {"broker": {"service": {"ports": {"rocketmq": 0}}}},
            "broker.service.ports.rocketmq: Must be greater than or equal to 1",
        ),
        (
            {"broker": {"containerPorts": {"rocketmq": "http"}}},
            "broker.containerPorts.rocketmq: Invalid type. Expected: integer, given: string",
        ),
        (  # the templates' validation: a combination
            {"broker": {"containerPorts": {"rocketmq": 10911}}},
            "VALUES VALIDATION:\n- broker.containerPorts: grpc, metrics (with metrics.enabled)"
            " and rocketmq",
        ),
    ],
)
def test_a_bad_rocketmq_port_is_refused(values: dict[str, Any], expected: str) -> None:
    assert expected in render_error(values)


def test_the_port_of_a_listener_that_is_off_is_not_checked() -> None:
    off = {"enabled": False}
    objects = render({"broker": {"rocketmq": off, "containerPorts": {"rocketmq": 10911}}})
    assert broker_sets(objects)
