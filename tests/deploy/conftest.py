"""The chart's value sets and the ``rendered`` fixture: every chart test module renders each
value set once."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.chart import RELEASE, Rendered, of_kind, render

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
