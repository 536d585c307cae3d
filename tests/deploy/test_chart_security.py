"""helm/tidemq's security defaults (docs/security.md): TLS and an ACL file on by default, from
Secrets the chart makes (or the operator's), probes that speak TLS, the brokers' own account,
metrics on the pod's address, and NetworkPolicies that admit clients to the client ports only."""

from __future__ import annotations

import base64
import subprocess
import tomllib
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
    render_error,
    render_notes,
    workloads_of,
)
from tidemq.services.auth import acl
from tidemq.services.nameserver import zk_settings

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
    ns_clients, ns_metrics = policies[f"{FULLNAME}-nameserver"]["spec"]["ingress"]
    assert [p["port"] for p in ns_clients["ports"]] == [9876]
    assert [p["port"] for p in ns_metrics["ports"]] == [9108]
    assert ns_metrics["from"] == [release, monitoring]
    (zk,) = policies[f"{FULLNAME}-zookeeper"]["spec"]["ingress"]
    assert zk == {"from": [release]}
    # Without clientsFrom, anyone may reach the client ports, and only them.
    open_clients = of_kind(render({}), "NetworkPolicy")[f"{FULLNAME}-broker"]["spec"]["ingress"][0]
    assert "from" not in open_clients


def test_the_ca_and_its_key_are_kept_in_a_secret_no_pod_mounts(tmp_path: Path) -> None:
    objects = render({})
    ca = _secret_files(objects, f"{FULLNAME}-ca", tmp_path / "ca")
    served = _secret_files(objects, f"{FULLNAME}-tls", tmp_path / "tls")
    assert ca["ca.crt"].read_bytes() == served["ca.crt"].read_bytes()
    assert "ca.key" not in served  # what every pod mounts holds no CA key
    # The key is the CA's: an operator can issue client certificates with it.
    assert _openssl("pkey", "-in", str(ca["ca.key"]), "-pubout") == _openssl(
        "x509", "-in", str(ca["ca.crt"]), "-noout", "-pubkey"
    )
    annotations = of_kind(objects, "Secret")[f"{FULLNAME}-ca"]["metadata"]["annotations"]
    assert annotations["helm.sh/resource-policy"] == "keep"
    for w in workloads_of(objects):
        secrets = {
            v["secret"]["secretName"]
            for v in w["spec"]["template"]["spec"].get("volumes", [])
            if "secret" in v
        }
        assert f"{FULLNAME}-ca" not in secrets, w["metadata"]["name"]


def test_under_mutual_tls_each_broker_proves_its_own_identity(tmp_path: Path) -> None:
    objects = render(
        {
            "tls": {"clientAuth": "require"},
            "failover": {"mode": "automatic"},
            "broker": {"groups": 2, "slavesPerGroup": 1},
        }
    )
    ca = _secret_files(objects, f"{FULLNAME}-ca", tmp_path / "ca")
    ids = _secret_files(objects, f"{FULLNAME}-broker-identities", tmp_path / "ids")
    expected = {  # under automatic failover ids start at 1 (0 is the elected master's)
        f"{FULLNAME}-broker-a-0": "broker:broker-a:1",
        f"{FULLNAME}-broker-a-1": "broker:broker-a:2",
        f"{FULLNAME}-broker-b-0": "broker:broker-b:1",
        f"{FULLNAME}-broker-b-1": "broker:broker-b:2",
    }
    assert set(ids) == {f"{pod}.{ext}" for pod in expected for ext in ("crt", "key")}
    for pod, identity in expected.items():
        cert, key = str(ids[f"{pod}.crt"]), str(ids[f"{pod}.key"])
        assert "OK" in _openssl("verify", "-CAfile", str(ca["ca.crt"]), cert)
        subject = _openssl("x509", "-in", cert, "-noout", "-subject", "-nameopt", "RFC2253")
        assert subject.strip() == f"subject=CN={identity}"
        assert _openssl("pkey", "-in", key, "-pubout") == _openssl(
            "x509", "-in", cert, "-noout", "-pubkey"
        )
        usage = _openssl("x509", "-in", cert, "-noout", "-ext", "extendedKeyUsage")
        assert "TLS Web Client Authentication" in usage and "TLS Web Server Authentication" in usage
        sans = _openssl("x509", "-in", cert, "-noout", "-ext", "subjectAltName")
        group = pod.rsplit("-", 1)[0]
        assert f"DNS:*.{group}-headless.{NAMESPACE}.svc.cluster.local" in sans
        assert "IP Address:127.0.0.1" in sans

    toml = tomllib.loads(of_kind(objects, "ConfigMap")[f"{FULLNAME}-broker"]["data"]["broker.toml"])
    assert toml["tls_client_auth"] == "require"
    assert toml["tls_cert_file"] == "/etc/tidemq/identity/tls.crt"
    assert toml["tls_ca_file"] == "/etc/tidemq/tls/ca.crt"
    ns = container(of_kind(objects, "Deployment")[f"{FULLNAME}-nameserver"])
    assert flag(ns["args"], "--tls-client-auth") == "require"
    assert ns["readinessProbe"]["exec"]["command"][-4:] == [
        "--tls-cert-file", "/etc/tidemq/tls/tls.crt", "--tls-key-file", "/etc/tidemq/tls/tls.key"
    ]  # fmt: skip
    for name in (f"{FULLNAME}-broker-a", f"{FULLNAME}-broker-b"):
        sts = of_kind(objects, "StatefulSet")[name]
        spec = sts["spec"]["template"]["spec"]
        (init,) = spec["initContainers"]
        script = init["command"][-1]
        assert '"/etc/tidemq/identities/$(POD_NAME).crt" /etc/tidemq/identity/tls.crt' in script
        assert '"/etc/tidemq/identities/$(POD_NAME).key" /etc/tidemq/identity/tls.key' in script
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["identities"]["secret"]["secretName"] == f"{FULLNAME}-broker-identities"
        broker = container(sts)
        mounts = {m["name"]: m["mountPath"] for m in broker["volumeMounts"]}
        assert "identities" not in mounts  # the broker sees its own certificate only
        assert mounts["identity"] == "/etc/tidemq/identity"
        assert broker["livenessProbe"]["exec"]["command"][-4:] == [
            "--tls-cert-file", "/etc/tidemq/identity/tls.crt",
            "--tls-key-file", "/etc/tidemq/identity/tls.key",
        ]  # fmt: skip


def test_under_mutual_tls_the_notes_say_how_to_issue_a_client_certificate(tmp_path: Path) -> None:
    notes = render_notes({"tls": {"clientAuth": "require"}})
    assert "--tls-cert-file /etc/tidemq/identity/tls.crt" in notes  # the status command's
    # The notes' openssl commands, run against a CA as the chart makes it, give a certificate
    # the CA verifies.
    ca = _secret_files(render({}), f"{FULLNAME}-ca", tmp_path / "pki")
    commands = [line.strip() for line in notes.splitlines() if line.strip().startswith("openssl")]
    assert len(commands) == 2
    for command in commands:
        done = subprocess.run(
            command, shell=True, cwd=ca["ca.crt"].parent, capture_output=True, text=True,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    app = str(ca["ca.crt"].parent / "app.crt")
    assert "OK" in _openssl("verify", "-CAfile", str(ca["ca.crt"]), app)


def test_mutual_tls_values_that_cannot_work_are_refused() -> None:
    error = render_error({"tls": {"clientAuth": "request"}})  # the schema
    assert 'tls.clientAuth must be one of the following: "none", "require"' in error
    error = render_error({"tls": {"enabled": False, "clientAuth": "require"}})
    assert "needs tls.enabled=true" in error
    error = render_error({"tls": {"clientAuth": "require", "existingSecret": "mq-cert"}})
    assert "tls.existingIdentitiesSecret" in error
    objects = render(
        {
            "tls": {
                "clientAuth": "require",
                "existingSecret": "mq-cert",
                "existingIdentitiesSecret": "mq-ids",
            }
        }
    )
    assert f"{FULLNAME}-broker-identities" not in of_kind(objects, "Secret")
    spec = of_kind(objects, "StatefulSet")[f"{FULLNAME}-broker-a"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["identities"]["secret"]["secretName"] == "mq-ids"


def test_brokers_write_their_znodes_as_the_charts_zookeeper_identity(tmp_path: Path) -> None:
    objects = render({})
    files = _secret_files(objects, f"{FULLNAME}-zk-auth", tmp_path / "zk-auth")
    user, password = zk_settings.parse_auth(f"@{files['zk-auth']}")
    assert user == "tidemq-brokers" and len(password) >= 32
    toml = of_kind(objects, "ConfigMap")[f"{FULLNAME}-broker"]["data"]["broker.toml"]
    assert tomllib.loads(toml)["zk_auth"] == "@/etc/tidemq/zk-auth/zk-auth"
    for sts in of_kind(objects, "StatefulSet").values():
        if "broker" not in sts["metadata"]["name"]:
            continue
        mounts = {m["name"]: m["mountPath"] for m in container(sts)["volumeMounts"]}
        assert mounts["zk-auth"] == "/etc/tidemq/zk-auth"
    # Nameservers only read the registry: they get no identity.
    ns = of_kind(objects, "Deployment")[f"{FULLNAME}-nameserver"]
    assert "zk-auth" not in {v["name"] for v in ns["spec"]["template"]["spec"]["volumes"]}


def test_the_operators_secrets_or_security_off() -> None:
    objects = render(
        {
            "tls": {"existingSecret": "mq-cert"},
            "acl": {"existingSecret": "mq-acl"},
            "zookeeper": {"auth": {"existingSecret": "mq-zk"}},
        }
    )
    assert not of_kind(objects, "Secret")
    sts = of_kind(objects, "StatefulSet")[f"{FULLNAME}-broker-a"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "mq-cert"
    assert volumes["acl"]["secret"]["secretName"] == "mq-acl"
    assert volumes["zk-auth"]["secret"]["secretName"] == "mq-zk"

    plain = render(
        {
            "tls": {"enabled": False},
            "acl": {"enabled": False},
            "zookeeper": {"auth": {"enabled": False}},
        }
    )
    assert not of_kind(plain, "Secret")
    ns = container(of_kind(plain, "Deployment")[f"{FULLNAME}-nameserver"])
    assert "--tls-cert-file" not in ns["args"] and "--acl-file" not in ns["args"]
    assert ns["readinessProbe"]["grpc"]["port"] == 9876  # Kubernetes' own gRPC probe again
    broker = container(of_kind(plain, "StatefulSet")[f"{FULLNAME}-broker-a"])
    assert "TIDEMQ_SECRET_KEY" not in {e["name"] for e in broker["env"]}
