"""`helm test`: the hook Pod creates the test topic, sends one message tagged with its uid and
consumes it back through the release, as a client with the release's TLS and ACL settings.
Rendered with ``--show-only`` (hooks render), validated against Kubernetes' schemas, and each
step's command line parsed by the tidemq CLI for every security combination."""

from __future__ import annotations

import itertools
import subprocess
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.deploy.chart import (
    CHART,
    KUBE_VERSION,
    KUBE_VERSIONS,
    NAMESPACE,
    RELEASE,
    flag,
    helm_binary,
    render,
    render_notes,
    run_helm,
)
from tidemq import cli

pytestmark = [
    pytest.mark.deploy,
    pytest.mark.skipif(helm_binary() is None, reason="helm is not installed: run `make tools`"),
]

FULLNAME = f"{RELEASE}-tidemq"
TEMPLATE = "templates/tests/test-produce-consume.yaml"
TLS_DIR = "/etc/tidemq/test/tls"
# (tls.enabled, tls.clientAuth, acl.enabled): mutual TLS needs TLS, so five combinations.
SECURITY = [
    (tls, auth, acl)
    for tls, auth, acl in itertools.product((True, False), ("none", "require"), (True, False))
    if tls or auth == "none"
]


def _render_test_pod(values: dict[str, Any]) -> dict[str, Any]:
    done = run_helm(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION,
        "--show-only", TEMPLATE, values=values,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (pod,) = [d for d in yaml.safe_load_all(done.stdout) if d]
    return dict(pod)


def _steps(pod: dict[str, Any]) -> dict[str, list[str]]:
    """Each step's tidemq command line (without the image's entrypoint or the shell around it)."""
    spec = pod["spec"]
    steps = {c["name"]: list(c["args"]) for c in spec["initContainers"]}
    (consume,) = spec["containers"]
    assert consume["args"][:3] == ["python", "-m", "tidemq.cli"]
    steps[consume["name"]] = consume["args"][3:]
    return steps


@pytest.mark.parametrize(("tls", "client_auth", "acl"), SECURITY)
def test_the_test_pod_sends_and_consumes_with_the_release_security(
    tls: bool, client_auth: str, acl: bool
) -> None:
    values = {"tls": {"enabled": tls, "clientAuth": client_auth}, "acl": {"enabled": acl}}
    pod = _render_test_pod(values)
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(pod, version, strict=True)
    meta = pod["metadata"]
    assert meta["name"] == f"{FULLNAME}-test"
    assert meta["annotations"]["helm.sh/hook"] == "test"
    assert set(meta["annotations"]["helm.sh/hook-delete-policy"].split(",")) == {
        "before-hook-creation",
        "hook-succeeded",
    }
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"  # a failed step fails the test, no retry loop
    assert spec["serviceAccountName"] == FULLNAME
    assert spec["automountServiceAccountToken"] is False

    steps = _steps(pod)
    assert list(steps) == ["topic", "send", "consume"]  # init containers run in this order
    parser = cli.build_parser()
    parsed = {name: parser.parse_args(args) for name, args in steps.items()}
    assert steps["topic"][:3] == ["topic", "create", "tidemq-helm-test"]
    assert steps["send"][:3] == ["send", "tidemq-helm-test", "helm test $(TEST_ID)"]
    assert flag(steps["send"], "--tag") == "$(TEST_ID)"
    assert steps["consume"][:2] == ["consume", "tidemq-helm-test"]
    assert flag(steps["consume"], "--tags") == "$(TEST_ID)"  # this run's message only
    assert flag(steps["consume"], "--max") == "1"
    assert parsed["consume"].group == "tidemq-helm-test"
    for name, args in parsed.items():
        assert args.nameserver == f"{FULLNAME}-nameserver:9876", name
        assert args.client_tls_ca_file == (f"{TLS_DIR}/ca.crt" if tls else None), name
        mutual = tls and client_auth == "require"
        assert args.client_tls_cert_file == (f"{TLS_DIR}/tls.crt" if mutual else None), name
        assert args.client_tls_key_file == (f"{TLS_DIR}/tls.key" if mutual else None), name
        assert (
            args.client_access_key is None and args.client_secret_key is None
        )  # never in the process list

    volumes = {v["name"]: v for v in spec["volumes"]}
    for c in [*spec["initContainers"], *spec["containers"]]:
        assert c["image"] == f"ghcr.io/tidemq/tidemq:{_app_version()}"
        env = {e["name"]: e for e in c["env"]}
        assert env["TEST_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
        if acl:
            for variable, key in (
                ("TIDEMQ_ACCESS_KEY", "access-key"),
                ("TIDEMQ_SECRET_KEY", "secret-key"),
            ):
                ref = env[variable]["valueFrom"]["secretKeyRef"]
                assert (ref["name"], ref["key"]) == (f"{FULLNAME}-acl", key)
        else:
            assert "TIDEMQ_ACCESS_KEY" not in env
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert mounts.get("tls") == (TLS_DIR if tls else None)
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert mounts["tmp"] == "/tmp"
    if tls:
        secret = volumes["tls"]["secret"]
        assert secret["secretName"] == f"{FULLNAME}-tls"
        # The CA alone, unless the servers want a client certificate.
        if client_auth == "require":
            assert "items" not in secret
        else:
            assert secret["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    else:
        assert "tls" not in volumes


def test_the_last_step_fails_unless_it_consumed_this_runs_message() -> None:
    """``tidemq consume`` exits 0 with nothing consumed: the shell around it checks the output.
    Run here with stand-ins for the consumer's output."""
    (consume,) = _render_test_pod({})["spec"]["containers"]
    shell = consume["command"]
    assert shell[:2] == ["sh", "-ec"]
    uid = "0f6c1e9a-3b7d-4e55-9c1a-2d4f6b8e0a11"

    def run(*printed: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*shell, "printf", "%s\n", *printed], env={"TEST_ID": uid, "PATH": "/usr/bin:/bin"},
            capture_output=True, text=True, check=False,
        )  # fmt: skip

    ok = run(f"tidemq-helm-test@broker-a#0 offset 7 tag={uid} keys={uid}: helm test {uid}")
    assert ok.returncode == 0, ok.stderr
    assert f"sent and consumed message {uid}" in ok.stdout
    nothing = run("")
    assert nothing.returncode == 1
    assert "was sent but not consumed" in nothing.stderr
    other = run("tidemq-helm-test@broker-a#0 offset 6 tag=an-earlier-run: helm test an-earlier-run")
    assert other.returncode == 1
    failed = subprocess.run(
        [*shell, "false"], env={"TEST_ID": uid}, capture_output=True, text=True, check=False
    )
    assert failed.returncode != 0  # a consumer that fails fails the test


def test_the_test_pod_is_a_hook_only_and_can_be_turned_off() -> None:
    # `helm template` renders hooks (so every value set's test pod is validated too);
    # --skip-tests leaves them out, as `helm install` installs no test hook.
    (pod,) = [o for o in render({}) if o["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    done = run_helm("template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, "--skip-tests")
    assert done.returncode == 0, done.stderr
    assert "kind: Pod\n" not in done.stdout
    done = run_helm(
        "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, "--show-only", TEMPLATE,
        values={"tests": {"enabled": False}},
    )  # fmt: skip
    assert done.returncode != 0  # nothing to show
    assert "helm test mq" in render_notes({})
    assert "helm test" not in render_notes({"tests": {"enabled": False}})


def _app_version() -> str:
    version: str = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    return version
