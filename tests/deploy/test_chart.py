"""helm/tidemq: lint, render over several value sets, validate every object against Kubernetes'
schemas (strict: unknown fields fail), and check what an operator relies on."""

from __future__ import annotations

import dataclasses
import tomllib
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.chart import (
    CHART,
    KUBE_VERSIONS,
    NAMESPACE,
    RELEASE,
    Rendered,
    broker_sets,
    container,
    flag,
    helm_binary,
    of_kind,
    pod_flags,
    render,
    render_error,
    run_helm,
)
from tests.deploy.conftest import VALUE_SETS
from tidemq import cli
from tidemq.services.broker import config as broker_config

pytestmark = [
    pytest.mark.deploy,
    pytest.mark.skipif(helm_binary() is None, reason="helm is not installed: run `make tools`"),
]


# Kinds from CRDs have no schema in kubernetes-validate; their fields are asserted below.
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_lint_strict(name: str) -> None:
    done = run_helm("lint", "--strict", str(CHART), values=VALUE_SETS[name])
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schema(
    rendered: Rendered, kube_version: str
) -> None:
    _, objects, _ = rendered
    for o in objects:
        if o["kind"] in CRD_KINDS:
            continue
        try:
            kubernetes_validate.validate(o, kube_version, strict=True)
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
        selector = dict(svc["spec"]["selector"])
        # Set on each pod by its StatefulSet controller, not in the template: the pod must be one
        # the StatefulSet makes.
        pod_name = selector.pop("statefulset.kubernetes.io/pod-name", None)
        pods = [
            w
            for w in workloads
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
            and (
                pod_name is None
                or (
                    pod_name.rpartition("-")[0] == w["metadata"]["name"]
                    and int(pod_name.rpartition("-")[2]) < w["spec"]["replicas"]
                )
            )
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
        if values.get("externalAccess", {}).get("enabled"):
            # Each pod's own broker.toml names its external Service (test_chart_external.py).
            assert advertise is None
            assert flag(c["args"], "--config") == "/etc/tidemq/$(POD_NAME).toml"
            continue
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
            if "--advertise" in args:
                args[args.index("--advertise") + 1] = f"pod-{ordinal}.example:10911"
            if "--metrics-listen" in args:
                args[args.index("--metrics-listen") + 1] = "10.0.0.7:9108"  # $(POD_IP)
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
    sm = of_kind(objects, "ServiceMonitor")[f"{RELEASE}-tidemq-broker"]
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
            "broker": {"replication": "SYNC", "slavesPerGroup": 0},
            "zookeeper": {"replicaCount": 2},
            "metrics": {"enabled": False, "serviceMonitor": {"enabled": True}},
        }
    )
    assert error.count("VALUES VALIDATION") == 1
    for expected in (
        "broker.replication=SYNC needs slaves",
        "zookeeper.replicaCount: must be odd",
        "metrics.serviceMonitor.enabled needs metrics.enabled=true",
    ):
        assert expected in error


def test_values_of_the_wrong_type_or_out_of_range_fail_the_schema_all_at_once() -> None:
    """values.schema.json refuses them before any template runs, listing every one."""
    error = render_error({"broker": {"groups": 0, "flush": "NEVER", "slavesPerGroup": "two"}})
    assert "values don't meet the specifications of the schema" in error
    for expected in (
        "broker.groups: Must be greater than or equal to 1",
        'broker.flush: broker.flush must be one of the following: "ASYNC", "SYNC"',
        "broker.slavesPerGroup: Invalid type. Expected: integer, given: string",
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
        ({"failover": {"mode": "auto"}}, "failover.mode must be one of the following"),
        ({"failover": {"electionPriority": 3}}, "only applies with failover.mode=automatic"),
        ({"zookeeper": {"enabled": False}}, "the registry needs ZooKeeper"),
        ({"zookeeper": {"connect": "zk:2181"}}, "needs zookeeper.enabled=false"),
        (
            {"broker": {"replication": "SYNC", "slavesPerGroup": 1, "minInsyncReplicas": 2}},
            "broker.minInsyncReplicas: must be 1 to broker.slavesPerGroup (1), got 2",
        ),
        ({"broker": {"zkSessionTimeoutMs": 60000}}, "broker.zkSessionTimeoutMs: ZooKeeper grants"),
        (
            {"broker": {"podAntiAffinityPreset": "strict"}},
            'broker.podAntiAffinityPreset must be one of the following: "soft", "hard"',
        ),
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
