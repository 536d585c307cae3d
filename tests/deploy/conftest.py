"""The chart's value sets and the ``rendered`` fixture: every chart test module renders each
value set once."""

from __future__ import annotations

import base64
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
    "mutual-tls-automatic-failover": {
        "tls": {"clientAuth": "require"},
        "failover": {"mode": "automatic", "electionPriority": 3},
        "broker": {"groups": 2, "slavesPerGroup": 1},
    },
    "monitoring-and-console": {
        "metrics": {"serviceMonitor": {"enabled": True}},
        "monitoring": {
            "dashboard": {"enabled": True, "annotations": {"grafana_folder": "tidemq"}},
            "prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
        },
        "broker": {"replication": "SYNC", "slavesPerGroup": 2},
        "console": {
            "enabled": True,
            "credentials": {"existingSecret": "tidemq-console-account"},
            "ingress": {"enabled": True, "className": "nginx", "hostname": "mq.example.com"},
        },
    },
    "external-load-balancer-spread": {
        "broker": {"groups": 2, "slavesPerGroup": 1, "topologySpreadPreset": "zone"},
        "externalAccess": {
            "enabled": True,
            "service": {
                "loadBalancerIPs": ["203.0.113.10", "203.0.113.11", "203.0.113.12", "203.0.113.13"],
                "loadBalancerNames": [f"b{i}.mq.example.com" for i in range(4)],
                "loadBalancerSourceRanges": ["198.51.100.0/24"],
                "annotations": {"external-dns.alpha.kubernetes.io/ttl": "60"},
            },
        },
        "nameserver": {
            "service": {"type": "LoadBalancer"},
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "nameserver"}},
                }
            ],
        },
        "tls": {"extraDnsNames": ["ns.mq.example.com"]},
        "serviceAccount": {"name": "tidemq", "annotations": {"iam.example/role": "mq"}},
    },
    "external-node-port-mutual-tls": {
        "broker": {"slavesPerGroup": 2},
        "externalAccess": {
            "enabled": True,
            "service": {
                "type": "NodePort",
                "domain": "nodes.mq.example.com",
                "nodePorts": [31001, 31002, 31003],
                "rocketmqNodePorts": [31081, 31082, 31083],
            },
        },
        "tls": {"clientAuth": "require"},
        "serviceAccount": {"create": False, "name": "tidemq-runner"},
        "console": {"enabled": False},
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
    """The values, the objects, and the brokers' broker.toml as a file (as pods mount it), with
    the Secrets it names (the TLS files, the ACL file, the ZooKeeper identity) written beside it
    as their volumes are."""
    values = VALUE_SETS[request.param]
    objects = render(values)
    directory = tmp_path_factory.mktemp(request.param)
    replace = {}
    for secret, mount in (
        (f"{RELEASE}-tidemq-tls", "tls"),
        (f"{RELEASE}-tidemq-acl", "acl"),
        (f"{RELEASE}-tidemq-zk-auth", "zk-auth"),
    ):
        found = of_kind(objects, "Secret").get(secret)
        if found is None:
            continue
        (directory / mount).mkdir()
        for key, value in found["data"].items():
            (directory / mount / key).write_bytes(base64.b64decode(value))
        replace[f"/etc/tidemq/{mount}/"] = f"{directory / mount}/"
    identities = of_kind(objects, "Secret").get(f"{RELEASE}-tidemq-broker-identities")
    if identities is not None:  # what the first broker pod's init container leaves it
        (directory / "identity").mkdir()
        pod = sorted(k for k in identities["data"] if k.endswith(".crt"))[0].removesuffix(".crt")
        for ext in ("crt", "key"):
            data = base64.b64decode(identities["data"][f"{pod}.{ext}"])
            (directory / "identity" / f"tls.{ext}").write_bytes(data)
        replace["/etc/tidemq/identity/"] = f"{directory / 'identity'}/"
    # broker.toml, and with externalAccess one file per pod (each advertising its Service).
    tomls = of_kind(objects, "ConfigMap")[f"{RELEASE}-tidemq-broker"]["data"]
    for key, mounted_text in tomls.items():
        text = mounted_text
        for mounted, written in replace.items():
            text = text.replace(mounted, written)
        (directory / key).write_text(text)
    return values, objects, directory / "broker.toml"
