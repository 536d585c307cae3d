"""helm/tidemq: lint, render over several value sets, validate every object against Kubernetes'
schemas (strict: unknown fields fail), and check what an operator relies on."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.chart import (
    CHART,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    container,
    flag,
    helm_binary,
    of_kind,
    render,
    render_error,
    render_notes,
    run_helm,
)
from tidemq import cli, entrypoint
from tidemq.services.broker import config as broker_config

pytestmark = [
    pytest.mark.deploy,
    pytest.mark.skipif(helm_binary() is None, reason="helm is not installed: run `make tools`"),
]

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "three-groups-two-slaves": {"broker": {"groups": 3, "slavesPerGroup": 2}},
    "external-zookeeper": {"zookeeper": {"enabled": False, "connect": "zk1:2181,zk2:2181/apps"}},
    "sync-replication": {
        "broker": {
            "replication": "SYNC",
            "slavesPerGroup": 2,
            "minInsyncReplicas": 2,
            "confirmOffset": True,
            "persistence": {"size": "100Gi", "storageClass": "fast-ssd"},
        }
    },
    "automatic-failover": {
        "failover": {"mode": "automatic", "electionPriority": 5},
        "broker": {"groups": 2, "slavesPerGroup": 2, "replication": "SYNC"},
    },
    "metrics-off-no-persistence": {
        "metrics": {"enabled": False},
        "broker": {"persistence": {"enabled": False}},
        "zookeeper": {"replicaCount": 1, "persistence": {"enabled": False}},
    },
    "rocketmq-off": {"broker": {"rocketmq": {"enabled": False}}},
    "rocketmq-ports-load-balancer": {
        "broker": {
            "containerPorts": {"rocketmq": 9081},
            "service": {"type": "LoadBalancer", "ports": {"rocketmq": 18081}},
        },
        "clusterDomain": "k8s.example",
    },
    "service-monitor-hard-anti-affinity": {
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
        "broker": {"podAntiAffinityPreset": "hard"},
        "commonLabels": {"team": "messaging"},
        "commonAnnotations": {"owner": "sre"},
    },
}

# Kinds from CRDs have no schema in kubernetes-validate; their fields are asserted below.
CRD_KINDS = {"ServiceMonitor"}


Rendered = tuple[dict[str, Any], list[dict[str, Any]], Path]


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    """The values, the objects, and the brokers' broker.toml as a file (as pods mount it)."""
    values = VALUE_SETS[request.param]
    objects = render(values)
    toml = tmp_path_factory.mktemp(request.param) / "broker.toml"
    toml.write_text(
        of_kind(objects, "ConfigMap")[f"{RELEASE}-tidemq-broker"]["data"]["broker.toml"]
    )
    return values, objects, toml


def workloads_of(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [*of_kind(objects, "Deployment").values(), *of_kind(objects, "StatefulSet").values()]


def broker_sets(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        name: o
        for name, o in of_kind(objects, "StatefulSet").items()
        if o["metadata"]["labels"]["app.kubernetes.io/component"] == "broker"
    }


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_lint_strict(name: str) -> None:
    done = run_helm("lint", "--strict", str(CHART), values=VALUE_SETS[name])
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_object_validates_against_the_kubernetes_schema(rendered: Rendered) -> None:
    _, objects, _ = rendered
    for o in objects:
        if o["kind"] in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(o, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{o['kind']}/{o['metadata']['name']}: {e.path}: {e.message}")
        assert o["metadata"].get("namespace", NAMESPACE) == NAMESPACE


def test_service_ports_reach_container_ports_and_probes_ask_the_grpc_port(
    rendered: Rendered,
) -> None:
    _, objects, _ = rendered
    workloads = [
        *of_kind(objects, "Deployment").values(),
        *of_kind(objects, "StatefulSet").values(),
    ]
    for svc in of_kind(objects, "Service").values():
        selector = svc["spec"]["selector"]
        pods = [
            w
            for w in workloads
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert pods, f"Service {svc['metadata']['name']} selects no pods"
        for w in pods:
            named = {p["name"]: p["containerPort"] for p in container(w)["ports"]}
            for port in svc["spec"]["ports"]:
                assert port["targetPort"] in named, (svc["metadata"]["name"], port)
                # Headless Services give pods' DNS names: the port is the container's own.
                if svc["spec"].get("clusterIP") == "None":
                    assert port["port"] == named[port["targetPort"]]
    for w in workloads:
        c = container(w)
        named = {p["name"]: p["containerPort"] for p in c["ports"]}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            if "grpc" in c.get(probe, {}):
                assert c[probe]["grpc"]["port"] == named["grpc"], (w["metadata"]["name"], probe)


def test_listen_advertise_and_metrics_ports_agree_with_the_containers(rendered: Rendered) -> None:
    values, objects, _ = rendered
    cm = of_kind(objects, "ConfigMap")[f"{RELEASE}-tidemq-broker"]
    toml = tomllib.loads(cm["data"]["broker.toml"])
    for sts in broker_sets(objects).values():
        c = container(sts)
        named = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert toml["listen"] == f"0.0.0.0:{named['grpc']}"
        advertise = flag(c["args"], "--advertise")
        assert advertise is not None
        assert advertise.startswith(f"$(POD_NAME).{sts['spec']['serviceName']}.$(POD_NAMESPACE).")
        assert advertise.endswith(f":{named['grpc']}")
        if values.get("metrics", {}).get("enabled", True):
            assert toml["metrics_listen"] == f"0.0.0.0:{named['metrics']}"
        else:
            assert toml["metrics_listen"] == ""
            assert "metrics" not in named
    ns = container(of_kind(objects, "Deployment")[f"{RELEASE}-tidemq-nameserver"])
    assert flag(ns["args"], "--listen") == f"0.0.0.0:{ns['ports'][0]['containerPort']}"


def pod_flags(sts: dict[str, Any], ordinal: int, toml: Path) -> list[str]:
    """What the entrypoint runs in pod ``ordinal`` of a broker StatefulSet."""
    args = list(container(sts)["args"])
    args[args.index("--config") + 1] = str(toml)  # mounted at /etc/tidemq in the pod
    hostname = f"{sts['metadata']['name']}-{ordinal}"
    return entrypoint.plan(args, {}, hostname).argv


def test_each_broker_pod_runs_its_role_and_broker_id(rendered: Rendered) -> None:
    """Classic: pod 0 of every group is its master (id 0), the others its slaves (their
    ordinals). Automatic: every pod is a candidate with the group's master role, ids from 1."""
    values, objects, toml = rendered
    broker = values.get("broker", {})
    groups, slaves = broker.get("groups", 1), broker.get("slavesPerGroup", 1)
    master_role = "SYNC_MASTER" if broker.get("replication") == "SYNC" else "ASYNC_MASTER"
    automatic = values.get("failover", {}).get("mode") == "automatic"
    sets = broker_sets(objects)
    assert sorted(sets) == [f"{RELEASE}-tidemq-broker-{chr(97 + i)}" for i in range(groups)]
    for sts in sets.values():
        assert sts["spec"]["replicas"] == 1 + slaves
        pods = [pod_flags(sts, i, toml) for i in range(1 + slaves)]
        ids = [flag(p, "--broker-id") for p in pods]
        roles = [flag(p, "--role") for p in pods]
        if automatic:
            assert ids == [str(i + 1) for i in range(1 + slaves)]  # 0 is the elected master's
            assert sts["spec"]["podManagementPolicy"] == "Parallel"
            assert roles == [master_role] * (1 + slaves)
            assert all(flag(p, "--failover") == "auto" for p in pods)
            assert all(flag(p, "--zk") == f"{RELEASE}-tidemq-zookeeper:2181" for p in pods)
            priority = values["failover"]["electionPriority"]
            assert all(flag(p, "--election-priority") == str(priority) for p in pods)
        else:
            assert ids == [str(i) for i in range(1 + slaves)]
            assert sts["spec"]["podManagementPolicy"] == "OrderedReady"  # the master first
            assert roles == [master_role] + ["SLAVE"] * slaves
            assert all("--failover" not in p for p in pods)


def test_broker_toml_and_flags_make_a_valid_broker_config(rendered: Rendered) -> None:
    """The ConfigMap, with each pod's flags, parses with the broker's own CLI and config class."""
    values, objects, toml = rendered
    broker = values.get("broker", {})
    for sts in broker_sets(objects).values():
        for ordinal in range(1 + broker.get("slavesPerGroup", 1)):
            args = pod_flags(sts, ordinal, toml)
            args[args.index("--advertise") + 1] = f"pod-{ordinal}.example:10911"
            parsed = vars(cli.build_parser().parse_args(args))
            keys = {f.name for f in dataclasses.fields(broker_config.BrokerConfig)}
            cfg = broker_config.load(str(toml), {k: parsed[k] for k in keys if k in parsed})
            assert cfg.cluster == values.get("clusterName", "DefaultCluster")
            if broker.get("replication") == "SYNC":
                assert cfg.replication.min_insync_replicas == broker.get("minInsyncReplicas", 1)
                assert cfg.replication.confirm_offset == broker.get("confirmOffset", False)


def test_pvc_size_and_storage_class_applied(rendered: Rendered) -> None:
    values, objects, _ = rendered
    persistence = values.get("broker", {}).get("persistence", {})
    for sts in broker_sets(objects).values():
        spec = sts["spec"]
        mounts = {m["name"]: m["mountPath"] for m in container(sts)["volumeMounts"]}
        assert mounts["store"] == "/var/lib/tidemq/store"
        if persistence.get("enabled", True):
            (claim,) = spec["volumeClaimTemplates"]
            assert claim["metadata"]["name"] == "store"
            requested = claim["spec"]["resources"]["requests"]["storage"]
            assert requested == persistence.get("size", "20Gi")
            assert claim["spec"].get("storageClassName") == persistence.get("storageClass")
        else:
            assert "volumeClaimTemplates" not in spec
            volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
            assert "emptyDir" in volumes["store"]


def test_pods_run_as_non_root_and_spread_a_group_over_nodes(rendered: Rendered) -> None:
    values, objects, _ = rendered
    hard = values.get("broker", {}).get("podAntiAffinityPreset") == "hard"
    workloads = [
        *of_kind(objects, "Deployment").values(),
        *of_kind(objects, "StatefulSet").values(),
    ]
    for w in workloads:
        pod = w["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert container(w)["securityContext"]["allowPrivilegeEscalation"] is False
        assert container(w)["securityContext"]["capabilities"]["drop"] == ["ALL"]
    for sts in broker_sets(objects).values():
        anti = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        if hard:
            term = anti["requiredDuringSchedulingIgnoredDuringExecution"][0]
        else:
            term = anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
        # The group's own pods, not every broker: groups may share nodes.
        assert term["labelSelector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]


def test_every_broker_group_has_a_headless_service_and_a_pdb(rendered: Rendered) -> None:
    _, objects, _ = rendered
    services = of_kind(objects, "Service")
    pdbs = of_kind(objects, "PodDisruptionBudget")
    for name, sts in broker_sets(objects).items():
        svc = services[sts["spec"]["serviceName"]]
        assert svc["spec"]["clusterIP"] == "None"
        assert svc["spec"]["publishNotReadyAddresses"] is True
        assert (
            pdbs[name]["spec"]["selector"]["matchLabels"] == sts["spec"]["selector"]["matchLabels"]
        )


def test_zookeeper_bundled_or_external(rendered: Rendered) -> None:
    values, objects, _ = rendered
    zk_values = values.get("zookeeper", {})
    ns = container(of_kind(objects, "Deployment")[f"{RELEASE}-tidemq-nameserver"])
    zk_sets = {n: o for n, o in of_kind(objects, "StatefulSet").items() if n.endswith("zookeeper")}
    if zk_values.get("enabled", True):
        replicas = zk_values.get("replicaCount", 3)
        (zk,) = zk_sets.values()
        assert zk["spec"]["replicas"] == replicas
        env = {e["name"]: e.get("value") for e in container(zk)["env"]}
        servers = env["ZOO_SERVERS"].split()
        assert len(servers) == replicas
        assert servers[0].startswith(f"server.1={RELEASE}-tidemq-zookeeper-0.")
        assert flag(ns["args"], "--zk") == f"{RELEASE}-tidemq-zookeeper:2181"
        if replicas > 1:
            pdb = of_kind(objects, "PodDisruptionBudget")[f"{RELEASE}-tidemq-zookeeper"]
            assert pdb["spec"]["minAvailable"] == replicas // 2 + 1
    else:
        assert not zk_sets
        assert flag(ns["args"], "--zk") == zk_values["connect"]
        for sts in broker_sets(objects).values():
            assert flag(container(sts)["args"], "--zk") == zk_values["connect"]


def test_service_monitor_scrapes_the_brokers_metrics_port() -> None:
    objects = render(VALUE_SETS["service-monitor-hard-anti-affinity"])
    (sm,) = of_kind(objects, "ServiceMonitor").values()
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    selector = sm["spec"]["selector"]
    scraped = [
        s
        for s in of_kind(objects, "Service").values()
        if selector["matchLabels"].items() <= s["metadata"]["labels"].items()
        and all(
            e["operator"] == "Exists" and e["key"] in s["metadata"]["labels"]
            for e in selector.get("matchExpressions", [])
        )
    ]
    # broker-a's headless Service; not the RocketMQ 5 Service, which has no metrics port.
    assert [s["metadata"]["name"] for s in scraped] == [f"{RELEASE}-tidemq-broker-a-headless"]
    assert "metrics" in {p["name"] for p in scraped[0]["spec"]["ports"]}
    assert not of_kind(render({}), "ServiceMonitor")


def test_a_config_change_rolls_the_brokers_and_nothing_else_does() -> None:
    def checksum(values: dict[str, Any]) -> str:
        (sts,) = broker_sets(render(values)).values()
        annotation: str = sts["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        return annotation

    base = checksum({})
    assert checksum({"broker": {"flush": "SYNC"}}) != base
    assert checksum({"broker": {"config": {"register_interval_ms": 10000}}}) != base
    assert checksum({"nameserver": {"replicaCount": 3}}) == base


def test_invalid_values_fail_with_one_message_listing_every_problem() -> None:
    error = render_error(
        {
            "broker": {"groups": 0, "replication": "SYNC", "slavesPerGroup": 0, "flush": "NEVER"},
            "zookeeper": {"replicaCount": 2},
            "metrics": {"enabled": False, "serviceMonitor": {"enabled": True}},
        }
    )
    assert error.count("VALUES VALIDATION") == 1
    for expected in (
        "broker.groups: must be 1 to 26",
        "broker.replication=SYNC needs slaves",
        "broker.flush: must be ASYNC or SYNC, got NEVER",
        "zookeeper.replicaCount: must be odd",
        "metrics.serviceMonitor.enabled needs metrics.enabled=true",
    ):
        assert expected in error


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {"failover": {"mode": "automatic"}, "zookeeper": {"enabled": False}},
            "failover.mode=automatic elects masters in ZooKeeper",
        ),
        (
            {"failover": {"mode": "automatic"}, "broker": {"slavesPerGroup": 0}},
            "failover.mode=automatic needs slaves to elect",
        ),
        ({"failover": {"mode": "auto"}}, "failover.mode: must be classic or automatic"),
        ({"failover": {"electionPriority": 3}}, "only applies with failover.mode=automatic"),
        ({"zookeeper": {"enabled": False}}, "the registry needs ZooKeeper"),
        ({"zookeeper": {"connect": "zk:2181"}}, "needs zookeeper.enabled=false"),
        (
            {"broker": {"replication": "SYNC", "slavesPerGroup": 1, "minInsyncReplicas": 2}},
            "broker.minInsyncReplicas: must be 1 to broker.slavesPerGroup (1), got 2",
        ),
        ({"broker": {"zkSessionTimeoutMs": 60000}}, "broker.zkSessionTimeoutMs: ZooKeeper grants"),
        ({"broker": {"podAntiAffinityPreset": "strict"}}, "broker.podAntiAffinityPreset"),
    ],
)
def test_invalid_combination_is_refused(values: dict[str, Any], expected: str) -> None:
    assert expected in render_error(values)


def test_values_yaml_documents_every_key() -> None:
    """Each leaf key of values.yaml has a ``## @param`` line (maps documented as a whole too)."""
    text = (CHART / "values.yaml").read_text()
    documented = {
        line.split()[2] for line in text.splitlines() if line.strip().startswith("## @param ")
    }

    def leaves(node: Any, prefix: str = "") -> list[str]:
        if isinstance(node, dict) and node and f"{prefix[:-1]}" not in documented:
            return [k for key, value in node.items() for k in leaves(value, f"{prefix}{key}.")]
        return [prefix[:-1]]

    missing = [k for k in leaves(yaml.safe_load(text)) if k not in documented]
    assert not missing, f"undocumented values: {missing}"


def test_release_namespace_and_names() -> None:
    objects = render({})
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("Deployment", f"{RELEASE}-tidemq-nameserver") in names
    assert ("Service", f"{RELEASE}-tidemq-nameserver") in names
    assert ("StatefulSet", f"{RELEASE}-tidemq-broker-a") in names
    assert ("Service", f"{RELEASE}-tidemq-broker-a-headless") in names
    assert ("StatefulSet", f"{RELEASE}-tidemq-zookeeper") in names
    assert ("ConfigMap", f"{RELEASE}-tidemq-broker") in names


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
        (
            {"broker": {"containerPorts": {"rocketmq": 70000}}},
            "broker.containerPorts.rocketmq: must be a port number (1 to 65535), got 70000",
        ),
        (
            {"broker": {"service": {"ports": {"rocketmq": 0}}}},
            "broker.service.ports.rocketmq: must be a port number (1 to 65535), got 0",
        ),
        (
            {"broker": {"containerPorts": {"rocketmq": "http"}}},
            "broker.containerPorts.rocketmq: must be a port number (1 to 65535), got http",
        ),
        (
            {"broker": {"containerPorts": {"rocketmq": 10911}}},
            "broker.containerPorts: grpc, metrics (with metrics.enabled) and rocketmq",
        ),
    ],
)
def test_a_bad_rocketmq_port_is_refused(values: dict[str, Any], expected: str) -> None:
    error = render_error(values)
    assert "VALUES VALIDATION" in error
    assert expected in error


def test_the_port_of_a_listener_that_is_off_is_not_checked() -> None:
    off = {"enabled": False}
    objects = render({"broker": {"rocketmq": off, "containerPorts": {"rocketmq": 10911}}})
    assert broker_sets(objects)
