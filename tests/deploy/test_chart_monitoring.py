"""helm/tidemq's monitoring and console: the Grafana dashboard ConfigMap, the PrometheusRule (its
schema, every PromQL expression parsed by Prometheus' own promtool), the nameservers' metrics
and the web console's Deployment, Service and Ingress. Every metric the rules and the dashboard
name must be one tidemq exports, scraped from real processes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.chart import (
    CHART,
    KUBE_VERSION,
    RELEASE,
    ROOT,
    container,
    flag,
    helm_binary,
    of_kind,
    render,
    render_error,
    render_notes,
)
from tests.deploy.conftest import VALUE_SETS
from tests.deploy.exported_metrics import scrape_a_cluster

pytestmark = [
    pytest.mark.deploy,
    pytest.mark.skipif(helm_binary() is None, reason="helm is not installed: run `make tools`"),
]

FULLNAME = f"{RELEASE}-tidemq"
DASHBOARD = CHART / "dashboards" / "tidemq.json"
# @kubernetes-models/prometheus-operator (npm, `make tools`): validators generated from
# prometheus-operator's API types, run by tests/deploy/validate_crds.mjs.
CRD_MODELS = ROOT / ".tools" / "node_modules" / "@kubernetes-models" / "prometheus-operator"
CRD_VALIDATOR = Path(__file__).with_name("validate_crds.mjs")
# What Grafana substitutes in a query before sending it to Prometheus; a stand-in for each.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
RULE_KEYS = {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
SEVERITIES = {"critical", "warning", "info"}
# Exported by applications that use the SDK (their own /metrics), not by tidemq's servers.
SDK_METRICS = {
    "tidemq_client_sends_total",
    "tidemq_client_send_retries_total",
    "tidemq_client_send_latency_seconds_bucket",
}
# Exported only by a broker started with `--failover auto`, which needs ZooKeeper: looked up in
# the module that defines them (services/broker/metrics_failover.py).
AUTOMATIC_FAILOVER_METRICS = {
    "tidemq_failover_elections_total",
    "tidemq_failover_master_absent_seconds",
}
METRIC = re.compile(r"\btidemq_[a-z0-9_]+\b")

MONITORED = VALUE_SETS["monitoring-and-console"]


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render(MONITORED)


def _rule(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (rule,) = of_kind(objects, "PrometheusRule").values()
    return rule


def _alerts(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in _rule(objects)["spec"]["groups"] for r in g["rules"]}


def _dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    # Variables: label_values(SELECTOR, LABEL) is Grafana's; Prometheus sees the selector.
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            found = re.fullmatch(r"label_values\((.+),\s*\w+\)", v["definition"])
            assert found, v["definition"]
            exprs.append(found[1])
    return exprs


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed: Debian's `prometheus` package (make system-deps)")
    return found


# -- the dashboard -------------------------------------------------------------------------------


def test_the_dashboard_configmap_is_labelled_for_grafanas_sidecar(
    objects: list[dict[str, Any]],
) -> None:
    cm = of_kind(objects, "ConfigMap")[f"{FULLNAME}-dashboard"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"]["grafana_folder"] == "tidemq"
    assert json.loads(cm["data"]["tidemq.json"]) == json.loads(DASHBOARD.read_text())
    kubernetes_validate.validate(cm, KUBE_VERSION, strict=True)
    # The label is the sidecar's setting; the ConfigMap only exists when asked for.
    custom = render({"monitoring": {"dashboard": {
        "enabled": True, "label": "dashboards", "labelValue": "tidemq", "namespace": "grafana",
    }}})  # fmt: skip
    cm = of_kind(custom, "ConfigMap")[f"{FULLNAME}-dashboard"]
    assert cm["metadata"]["labels"]["dashboards"] == "tidemq"
    assert cm["metadata"]["namespace"] == "grafana"
    assert f"{FULLNAME}-dashboard" not in of_kind(render({}), "ConfigMap")


def test_the_dashboard_is_well_formed() -> None:
    """What Grafana needs of a provisioned dashboard: unique panel ids, a grid position inside
    the 24 columns, and every query panel on the datasource variable with refIds and exprs; and
    every variable a query uses is defined."""
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("cluster", "broker"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"]["uid"] == "${datasource}"
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    titles = [p["title"] for p in panels if p["type"] != "row"]
    assert len(titles) == len(set(titles))
    for p in panels:
        grid = p["gridPos"]
        assert all(isinstance(grid[k], int) and grid[k] >= 0 for k in ("h", "w", "x", "y")), p
        assert grid["x"] + grid["w"] <= 24, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["datasource"]["uid"] == "${datasource}", p["title"]
    for expr in _dashboard_exprs(dashboard):
        for used in re.findall(r"\$(\w+)", expr):
            assert used in variables or f"${used}" in GRAFANA_VARIABLES, (used, expr)
    # The panels the chart promises (docs/deployment.md#monitoring).
    for title in (
        "Produce rate per topic", "Consume rate per topic", "Consumer lag per group",
        "Consumer lag per queue", "Replication lag per slave (bytes)",
        "Replication lag per slave (seconds)", "Disk usage", "Writable and failed",
        "Broker role and epoch", "Elections", "Time without a master",
        "Send latency p99 (broker)", "Receive in flight", "Receive retrying", "Dead letters",
        "Timer pending", "Timer lateness p99", "Transactions open", "Auth refusals by reason",
    ):  # fmt: skip
        assert title in titles


def test_every_dashboard_query_parses_as_promql(tmp_path: Path) -> None:
    """Each query, its Grafana variables substituted, as a recording rule for promtool."""
    promtool = _promtool()
    rules = []
    for i, query in enumerate(_dashboard_exprs(json.loads(DASHBOARD.read_text()))):
        expr = query
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        expr = re.sub(r"\$\w+", ".*", expr)  # the dashboard's own variables: regex matchers
        rules.append({"record": f"tidemq:dashboard_query_{i}", "expr": expr})
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


# -- the alerting rules --------------------------------------------------------------------------


def test_every_alert_has_a_severity_a_summary_a_description_and_a_for(
    objects: list[dict[str, Any]],
) -> None:
    rule = _rule(objects)
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "prom"
    alerts = _alerts(objects)
    for name, alert in alerts.items():
        assert set(alert) <= RULE_KEYS, (name, set(alert) - RULE_KEYS)
        assert alert["labels"]["severity"] in SEVERITIES, name
        assert alert["annotations"]["summary"] and alert["annotations"]["description"], name
        assert re.fullmatch(r"\d+[smh]", alert["for"]), name
    # What docs/operations.md's "Starting points for alerts" name.
    for name in (
        "TidemqStoreNotWritable", "TidemqStoreFailed", "TidemqDispatchDiskFull",
        "TidemqStoreDiskAlmostFull", "TidemqDispatchBacklog", "TidemqInternalErrors",
        "TidemqNoMaster", "TidemqMasterAbsent", "TidemqSyncMasterShortOfSlaves",
        "TidemqSlaveOutOfSync", "TidemqSlaveLagging", "TidemqSlaveDisconnected",
        "TidemqSlaveConfigSyncStale", "TidemqConsumerQueueLag", "TidemqConsumerLagGrowing",
        "TidemqTimerLate", "TidemqTransactionsResolvedByCheck", "TidemqAuthRefusals",
        "TidemqIdempotentProducerFenced",
    ):  # fmt: skip
        assert name in alerts


def test_thresholds_labels_and_left_out_alerts_come_from_the_values() -> None:
    objects = render({
        "monitoring": {"prometheusRule": {
            "enabled": True,
            "ruleLabels": {"team": "messaging"},
            "disabled": ["TidemqTimerLate"],
            "thresholds": {"consumerQueueLagMessages": 5000, "diskUsageRatio": 0.7},
        }},
        "broker": {"replication": "SYNC", "slavesPerGroup": 2, "minInsyncReplicas": 2},
    })  # fmt: skip
    alerts = _alerts(objects)
    assert "TidemqTimerLate" not in alerts
    assert "tidemq_consumer_queue_lag_messages > 5000 " in alerts["TidemqConsumerQueueLag"]["expr"]
    assert alerts["TidemqStoreDiskAlmostFull"]["expr"].endswith("> 0.7")
    assert alerts["TidemqSyncMasterShortOfSlaves"]["expr"].endswith("< 2")
    assert all(a["labels"]["team"] == "messaging" for a in alerts.values())
    # The severity is the alert's own: ruleLabels cannot drop it.
    assert alerts["TidemqStoreFailed"]["labels"]["severity"] == "critical"
    # Only a SYNC_MASTER waits for slaves.
    assert "TidemqSyncMasterShortOfSlaves" not in _alerts(
        render({"monitoring": {"prometheusRule": {"enabled": True}}})
    )
    assert not of_kind(render({}), "PrometheusRule")
    assert "monitoring.prometheusRule.enabled needs metrics.enabled=true" in render_error(
        {"metrics": {"enabled": False}, "monitoring": {"prometheusRule": {"enabled": True}}}
    )


def test_every_alert_expression_parses_with_promtool(
    objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    """The rule groups as Prometheus loads them from the operator: promtool checks the PromQL,
    the durations and the annotation templates."""
    promtool = _promtool()
    path = tmp_path / "tidemq.rules.yml"
    path.write_text(yaml.safe_dump(_rule(objects)["spec"]))
    done = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_alerts(objects))} rules found" in done.stdout


def test_prometheus_operator_objects_validate_against_the_operators_schema(
    objects: list[dict[str, Any]],
) -> None:
    node = shutil.which("node")
    if node is None or not CRD_MODELS.exists():
        pytest.skip("node or @kubernetes-models/prometheus-operator missing: run `make tools`")
    crds = [o for o in objects if o["apiVersion"].startswith("monitoring.coreos.com/")]
    assert {o["kind"] for o in crds} == {"PrometheusRule", "ServiceMonitor"}
    done = subprocess.run(
        [node, str(CRD_VALIDATOR), str(CRD_MODELS)],
        input=json.dumps(crds),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # The validator does refuse what the operator would.
    broken = json.loads(json.dumps(_rule(objects)))
    broken["spec"]["groups"][0]["rules"][0]["for"] = "five minutes"
    done = subprocess.run(
        [node, str(CRD_VALIDATOR), str(CRD_MODELS)],
        input=json.dumps([broken]),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 1 and "/for must match pattern" in done.stdout, done.stdout


def test_every_metric_the_rules_and_dashboard_name_is_exported(
    objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    """Scraped from a real nameserver, master and slave. The SDK's series come from
    applications and the automatic-failover ones from brokers under `--failover auto`: those are
    looked up where they are defined instead."""
    referenced: set[str] = set()
    for alert in _alerts(render({
        "monitoring": {"prometheusRule": {"enabled": True}}, "broker": {"replication": "SYNC"},
    })).values():  # fmt: skip
        referenced.update(METRIC.findall(alert["expr"]))
    for expr in _dashboard_exprs(json.loads(DASHBOARD.read_text())):
        referenced.update(METRIC.findall(expr))
    exported = set().union(*scrape_a_cluster(tmp_path).values())
    sdk_source = "\n".join(
        p.read_text() for p in (ROOT / "tidemq").rglob("*.py") if "services" not in p.parts
    )
    failover_source = (ROOT / "services" / "broker" / "metrics_failover.py").read_text()

    def defined(name: str) -> bool:
        family = f'"{re.sub(r"_(total|bucket)$", "", name)}"'
        if name in SDK_METRICS:
            return family in sdk_source
        return name in AUTOMATIC_FAILOVER_METRICS and family in failover_source

    missing = sorted(name for name in referenced - exported if not defined(name))
    assert not missing, f"not exported by tidemq: {missing}"


# -- the nameservers' metrics --------------------------------------------------------------------


def test_nameservers_serve_metrics_and_a_service_monitor_scrapes_them(
    objects: list[dict[str, Any]],
) -> None:
    ns = container(of_kind(objects, "Deployment")[f"{FULLNAME}-nameserver"])
    assert flag(ns["args"], "--metrics-listen") == "$(POD_IP):9108"
    assert {p["name"]: p["containerPort"] for p in ns["ports"]}["metrics"] == 9108
    services = of_kind(objects, "Service")
    sm = of_kind(objects, "ServiceMonitor")[f"{FULLNAME}-nameserver"]
    selector = sm["spec"]["selector"]["matchLabels"]
    scraped = [
        name for name, s in services.items() if selector.items() <= s["metadata"]["labels"].items()
    ]
    assert scraped == [f"{FULLNAME}-nameserver-metrics"]  # not the clients' Service
    assert services[scraped[0]]["spec"]["clusterIP"] == "None"
    client_ports = services[f"{FULLNAME}-nameserver"]["spec"]["ports"]
    assert "metrics" not in {p["name"] for p in client_ports}
    off = render({"metrics": {"enabled": False}})
    off_ns = container(of_kind(off, "Deployment")[f"{FULLNAME}-nameserver"])
    assert "--metrics-listen" not in off_ns["args"]
    assert f"{FULLNAME}-nameserver-metrics" not in of_kind(off, "Service")


# -- the web console -----------------------------------------------------------------------------


def test_the_console_runs_against_the_nameservers_with_the_clusters_ca(
    objects: list[dict[str, Any]],
) -> None:
    deployment = of_kind(objects, "Deployment")[f"{FULLNAME}-console"]
    c = container(deployment)
    args = c["args"]
    assert args[0] == "console"
    assert flag(args, "--nameserver") == f"{FULLNAME}-nameserver:9876"
    assert flag(args, "--listen") == "0.0.0.0:8080"
    assert flag(args, "--log-format") == "text"
    assert flag(args, "--tls-ca-file") == "/etc/tidemq/console/tls/ca.crt"
    # Its reads are signed with the account of the Secret it is given.
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"]}
    assert env["TIDEMQ_ACCESS_KEY"] == {"name": "tidemq-console-account", "key": "access-key"}
    assert env["TIDEMQ_SECRET_KEY"] == {"name": "tidemq-console-account", "key": "secret-key"}
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["resources"]["limits"]["memory"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    # The CA alone: the console holds no server key.
    assert volumes["ca"]["secret"] == {
        "secretName": f"{FULLNAME}-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }  # fmt: skip
    assert set(volumes) == {"tmp", "ca"}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["ca"] == "/etc/tidemq/console/tls"

    service = of_kind(objects, "Service")[f"{FULLNAME}-console"]
    assert service["spec"]["selector"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    ingress = of_kind(objects, "Ingress")[f"{FULLNAME}-console"]
    assert ingress["spec"]["ingressClassName"] == "nginx"
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "mq.example.com"
    assert rule["http"]["paths"][0]["backend"]["service"] == {
        "name": f"{FULLNAME}-console", "port": {"name": "http"},
    }  # fmt: skip
    for o in (deployment, service, ingress):
        kubernetes_validate.validate(o, KUBE_VERSION, strict=True)


def test_the_console_reads_with_the_charts_admin_account_unless_given_one() -> None:
    objects = render({"console": {"enabled": True}})
    c = container(of_kind(objects, "Deployment")[f"{FULLNAME}-console"])
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"]}
    assert env["TIDEMQ_ACCESS_KEY"] == {"name": f"{FULLNAME}-acl", "key": "access-key"}


def test_the_console_is_off_by_default_and_plain_without_tls_or_acl() -> None:
    objects = render({})
    assert f"{FULLNAME}-console" not in of_kind(objects, "Deployment")
    assert not of_kind(objects, "Ingress")
    plain = render({
        "console": {"enabled": True, "logFormat": "json"},
        "tls": {"enabled": False}, "acl": {"enabled": False},
    })  # fmt: skip
    c = container(of_kind(plain, "Deployment")[f"{FULLNAME}-console"])
    assert "--tls-ca-file" not in c["args"] and "env" not in c
    assert flag(c["args"], "--log-format") == "json"
    assert {m["name"] for m in c["volumeMounts"]} == {"tmp"}


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {
                "console": {"enabled": True, "credentials": {"existingSecret": "c"}},
                "tls": {"clientAuth": "require"},
            },
            "cannot join a cluster with tls.clientAuth=require",
        ),
        (
            {"console": {"enabled": True, "logFormat": "xml"}, "acl": {"enabled": False}},
            'console.logFormat must be one of the following: "text", "json"',  # the schema
        ),
        (
            {
                "console": {"enabled": True, "containerPorts": {"http": 0}},
                "acl": {"enabled": False},
            },
            "console.containerPorts.http: Must be greater than or equal to 1",  # the schema
        ),
    ],
)
def test_console_values_that_cannot_work_are_refused(values: dict[str, Any], expected: str) -> None:
    assert expected in render_error(values)


def test_the_install_notes_say_where_the_console_is() -> None:
    forwarded = render_notes({"console": {"enabled": True}})
    assert f"port-forward svc/{FULLNAME}-console 8080:8080" in forwarded
    routed = render_notes(
        {"console": {"enabled": True, "ingress": {"enabled": True, "hostname": "mq.example.com"}}}
    )
    assert "http://mq.example.com/" in routed
    assert f"svc/{FULLNAME}-console" not in routed
    assert "web console" not in render_notes({})
