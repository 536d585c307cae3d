"""helm/tidemq's security defaults (docs/security.md): TLS and an ACL file on by default, from
Secrets the chart makes (or the operator's), probes that speak TLS, the brokers' own account,
metrics on the pod's address, and NetworkPolicies that admit clients to the client ports only."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.chart import (
    NAMESPACE,
    RELEASE,
    container,
    flag,
    helm_binary,
    of_kind,
    render,
    workloads_of,
)
from tidemq.services.auth import acl

pytestmark = [
    pytest.mark.deploy,
    pytest.mark.skipif(helm_binary() is None, reason="helm is not installed: run `make tools`"),
]

FULLNAME = f"{RELEASE}-tidemq"


def _secret_files(objects: list[dict[str, Any]], name: str, into: Path) -> dict[str, Path]:
    secret = of_kind(objects, "Secret")[name]
    into.mkdir()
    files = {}
    for key, value in secret["data"].items():
        files[key] = into / key
        files[key].write_bytes(base64.b64decode(value))
    return files


def _openssl(*args: str) -> str:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_by_default_the_chart_makes_a_ca_and_a_certificate_covering_every_name_dialled(
    tmp_path: Path,
) -> None:
    objects = render({"broker": {"groups": 2}})
    secret = of_kind(objects, "Secret")[f"{FULLNAME}-tls"]
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    files = _secret_files(objects, f"{FULLNAME}-tls", tmp_path / "tls")
    assert "OK" in _openssl("verify", "-CAfile", str(files["ca.crt"]), str(files["tls.crt"]))
    sans = _openssl("x509", "-in", str(files["tls.crt"]), "-noout", "-ext", "subjectAltName")
    svc = "svc.cluster.local"
    for name in (
        f"{FULLNAME}-nameserver",
        f"{FULLNAME}-nameserver.{NAMESPACE}.{svc}",
        f"{FULLNAME}-broker.{NAMESPACE}.{svc}",
        f"*.{FULLNAME}-broker-a-headless.{NAMESPACE}.{svc}",
        f"*.{FULLNAME}-broker-b-headless.{NAMESPACE}.{svc}",
    ):
        assert f"DNS:{name}" in sans
    assert "IP Address:127.0.0.1" in sans  # the probes dial the pod's loopback


def test_by_default_every_server_serves_tls_checks_an_acl_and_probes_speak_tls(
    tmp_path: Path,
) -> None:
    objects = render({})
    files = _secret_files(objects, f"{FULLNAME}-acl", tmp_path / "acl")
    parsed = acl.load(str(files["plain_acl.yml"]))
    admin = parsed.accounts[files["access-key"].read_text()]
    assert admin.admin and admin.secret_key == files["secret-key"].read_text()
    assert len(admin.secret_key) == 32

    ns = container(of_kind(objects, "Deployment")[f"{FULLNAME}-nameserver"])
    assert flag(ns["args"], "--tls-cert-file") == "/etc/tidemq/tls/tls.crt"
    assert flag(ns["args"], "--tls-ca-file") == "/etc/tidemq/tls/ca.crt"
    assert flag(ns["args"], "--acl-file") == "/etc/tidemq/acl/plain_acl.yml"
    cm = of_kind(objects, "ConfigMap")[f"{FULLNAME}-broker"]["data"]["broker.toml"]
    assert 'tls_key_file = "/etc/tidemq/tls/tls.key"' in cm
    assert 'acl_file = "/etc/tidemq/acl/plain_acl.yml"' in cm

    for w in workloads_of(objects):
        if w["metadata"]["labels"]["app.kubernetes.io/component"] == "zookeeper":
            continue
        c = container(w)
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert (mounts["tls"], mounts["acl"]) == ("/etc/tidemq/tls", "/etc/tidemq/acl")
        volumes = {v["name"]: v for v in w["spec"]["template"]["spec"]["volumes"]}
        assert volumes["tls"]["secret"]["secretName"] == f"{FULLNAME}-tls"
        grpc_port = {p["name"]: p["containerPort"] for p in c["ports"]}["grpc"]
        for probe in ("livenessProbe", "readinessProbe"):
            command = c[probe]["exec"]["command"]
            assert command[3:] == [
                "health", f"127.0.0.1:{grpc_port}", "--tls-ca-file", "/etc/tidemq/tls/ca.crt"
            ]  # fmt: skip

    broker = container(of_kind(objects, "StatefulSet")[f"{FULLNAME}-broker-a"])
    env = {e["name"]: e for e in broker["env"]}
    for var, key in (("TIDEMQ_ACCESS_KEY", "access-key"), ("TIDEMQ_SECRET_KEY", "secret-key")):
        assert env[var]["valueFrom"]["secretKeyRef"] == {"name": f"{FULLNAME}-acl", "key": key}
    assert flag(broker["args"], "--metrics-listen") == "$(POD_IP):9108"
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_network_policies_admit_clients_to_the_client_ports_only() -> None:
    monitoring = {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}
    apps = {"namespaceSelector": {"matchLabels": {"team": "orders"}}}
    objects = render({"networkPolicy": {"metricsFrom": [monitoring], "clientsFrom": [apps]}})
    policies = of_kind(objects, "NetworkPolicy")
    release = {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/instance": RELEASE,
                "app.kubernetes.io/name": "tidemq",
            }
        }
    }
    clients, metrics = policies[f"{FULLNAME}-broker"]["spec"]["ingress"]
    assert [p["port"] for p in clients["ports"]] == [10911, 8081]
    assert clients["from"] == [apps, release]
    assert [p["port"] for p in metrics["ports"]] == [9108]
    assert metrics["from"] == [release, monitoring]
    (ns_clients,) = policies[f"{FULLNAME}-nameserver"]["spec"]["ingress"]
    assert [p["port"] for p in ns_clients["ports"]] == [9876]
    (zk,) = policies[f"{FULLNAME}-zookeeper"]["spec"]["ingress"]
    assert zk == {"from": [release]}
    # Without clientsFrom, anyone may reach the client ports, and only them.
    open_clients = of_kind(render({}), "NetworkPolicy")[f"{FULLNAME}-broker"]["spec"]["ingress"][0]
    assert "from" not in open_clients


def test_the_operators_secrets_or_security_off() -> None:
    objects = render({"tls": {"existingSecret": "mq-cert"}, "acl": {"existingSecret": "mq-acl"}})
    assert not of_kind(objects, "Secret")
    sts = of_kind(objects, "StatefulSet")[f"{FULLNAME}-broker-a"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "mq-cert"
    assert volumes["acl"]["secret"]["secretName"] == "mq-acl"

    plain = render({"tls": {"enabled": False}, "acl": {"enabled": False}})
    assert not of_kind(plain, "Secret")
    ns = container(of_kind(plain, "Deployment")[f"{FULLNAME}-nameserver"])
    assert "--tls-cert-file" not in ns["args"] and "--acl-file" not in ns["args"]
    assert ns["readinessProbe"]["grpc"]["port"] == 9876  # Kubernetes' own gRPC probe again
    broker = container(of_kind(plain, "StatefulSet")[f"{FULLNAME}-broker-a"])
    assert "TIDEMQ_SECRET_KEY" not in {e["name"] for e in broker["env"]}
