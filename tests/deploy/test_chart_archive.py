"""helm/tidemq's `archive` values (docs/archive.md): each broker group archives under
`<uri or volume>/<group>` with the broker's `--archive-*` flags; a directory archive is a
PersistentVolumeClaim every broker pod mounts (an init container makes the group's directory),
an S3 one gets its credentials from a Secret (or the pods' own identity). Rendered with the real
helm, validated against Kubernetes' schemas, the flags parsed by the broker's own CLI and config;
values that cannot work are refused with one message naming them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.deploy.chart import (
    CHART,
    KUBE_VERSIONS,
    RELEASE,
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
from tidemq import cli
from tidemq.services.broker import config as broker_config
from tidemq.storage.archive.config import ArchiveConfig

pytestmark = [
    pytest.mark.deploy,
    pytest.mark.skipif(helm_binary() is None, reason="helm is not installed: run `make tools`"),
]

FULLNAME = f"{RELEASE}-tidemq"
GROUPS = ("broker-a", "broker-b")
# TLS, the ACL and ZooKeeper's identity stay on (the defaults) except where a broker.toml is
# loaded: their files would have to exist for that (tests/deploy/conftest.py writes them).
PLAIN = {
    "tls": {"enabled": False},
    "acl": {"enabled": False},
    "zookeeper": {"auth": {"enabled": False}},
}
DIRECTORY = {
    "archive": {"enabled": True, "volume": {"existingClaim": "tidemq-archive"}},
    "broker": {"groups": 2, "slavesPerGroup": 1},
}
S3 = {
    "archive": {
        "enabled": True,
        "uri": "s3://tidemq-archive/prod/",
        "defaultPolicy": "delete",
        "compression": "none",
        "cacheBytes": 536870912,
        "intervalMs": 2000,
        "s3": {
            "endpoint": "https://minio.example:9000",
            "region": "eu-west-1",
            "existingSecret": "tidemq-s3",
        },
    },
    "broker": {"groups": 2, "slavesPerGroup": 1},
}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _validated(values: dict[str, Any]) -> list[dict[str, Any]]:
    objects = render(values)
    for o in objects:
        if o["kind"] in ("ServiceMonitor", "PrometheusRule"):
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(o, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{o['kind']}/{o['metadata']['name']}: {e.path}: {e.message}")
    return objects


def _env(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def _archive_config(values: dict[str, Any], tmp_path: Path) -> dict[str, ArchiveConfig]:
    """Each group's ArchiveConfig as its pods' broker builds it: the chart's broker.toml and
    each pod's flags (through the image's entrypoint), parsed by the broker's CLI and loaded by
    its config code, as ``services.broker.cli.run`` does."""
    objects = render(_merge(values, PLAIN))
    toml = tmp_path / "broker.toml"
    toml.write_text(of_kind(objects, "ConfigMap")[f"{FULLNAME}-broker"]["data"]["broker.toml"])
    out: dict[str, ArchiveConfig] = {}
    for name, sts in broker_sets(objects).items():
        seen = set()
        for ordinal in range(sts["spec"]["replicas"]):
            args = pod_flags(sts, ordinal, toml)
            args[args.index("--advertise") + 1] = f"pod-{ordinal}.example:10911"
            args[args.index("--metrics-listen") + 1] = "10.0.0.7:9108"
            parsed = vars(cli.build_parser().parse_args(args))
            keys = {f.name for f in dataclasses.fields(broker_config.BrokerConfig)}
            overrides: dict[str, Any] = {k: parsed[k] for k in keys if k in parsed}
            overrides["archive"] = {
                k.removeprefix("archive."): v for k, v in parsed.items() if k.startswith("archive.")
            }
            cfg = broker_config.load(str(toml), overrides)
            assert cfg.archive is not None
            seen.add(cfg.archive)
        (out[name.removeprefix(f"{FULLNAME}-")],) = seen  # one archive for a group's pods
    return out


def test_the_archive_is_off_by_default() -> None:
    for sts in broker_sets(render({})).values():
        c = container(sts)
        assert not [a for a in c["args"] if a.startswith("--archive")]
        assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"} & _env(c).keys()
        assert "archive" not in {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]}
        assert "initContainers" not in sts["spec"]["template"]["spec"]


def test_a_directory_archive_mounts_the_claim_in_every_broker_pod(tmp_path: Path) -> None:
    objects = _validated(DIRECTORY)
    sets = broker_sets(objects)
    assert sorted(sets) == [f"{FULLNAME}-{g}" for g in GROUPS]
    for group in GROUPS:
        pod = sets[f"{FULLNAME}-{group}"]["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["archive"]["persistentVolumeClaim"] == {"claimName": "tidemq-archive"}
        c = container(sets[f"{FULLNAME}-{group}"])
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        assert mounts["archive"]["mountPath"] == "/archive"
        assert not mounts["archive"].get("readOnly")  # a slave elected master archives
        assert flag(c["args"], "--archive-uri") == f"/archive/{group}"
        assert flag(c["args"], "--archive-default-policy") == "archive"
        assert flag(c["args"], "--archive-compression") == "zstd"
        assert flag(c["args"], "--archive-cache-bytes") == "268435456"
        assert flag(c["args"], "--archive-interval-ms") == "5000"
        assert flag(c["args"], "--archive-s3-endpoint") is None
        assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & _env(c).keys()
        # The group's directory exists before the broker starts (a missing one is an
        # unmounted volume to it), made by the same user the broker runs as.
        (init,) = pod["initContainers"]
        assert init["name"] == "archive-dir"
        assert init["command"] == ["mkdir", "-p", f"/archive/{group}"]
        assert init["image"] == c["image"]
        assert init["securityContext"] == c["securityContext"]
        assert init["volumeMounts"] == [{"name": "archive", "mountPath": "/archive"}]
    configs = _archive_config(DIRECTORY, tmp_path)
    assert configs == {
        g: ArchiveConfig(f"/archive/{g}", cache_bytes=268435456, interval_ms=5000) for g in GROUPS
    }


def test_a_directory_archive_under_mutual_tls_keeps_both_init_containers() -> None:
    values = _merge(
        DIRECTORY,
        {
            "tls": {"clientAuth": "require"},
            "archive": {
                "uri": "file:///mnt/archive/tidemq",
                "volume": {"mountPath": "/mnt/archive"},
            },
        },
    )
    for sts in broker_sets(_validated(values)).values():
        group = sts["metadata"]["labels"]["tidemq.io/broker-group"]
        pod = sts["spec"]["template"]["spec"]
        assert [i["name"] for i in pod["initContainers"]] == ["identity", "archive-dir"]
        assert pod["initContainers"][1]["command"][-1] == f"/mnt/archive/tidemq/{group}"
        c = container(sts)
        assert flag(c["args"], "--archive-uri") == f"file:///mnt/archive/tidemq/{group}"
        assert {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["archive"] == "/mnt/archive"


def test_an_s3_archive_gets_its_secret_as_environment_and_its_flags(tmp_path: Path) -> None:
    objects = _validated(S3)
    for group in GROUPS:
        sts = broker_sets(objects)[f"{FULLNAME}-{group}"]
        pod = sts["spec"]["template"]["spec"]
        c = container(sts)
        assert flag(c["args"], "--archive-uri") == f"s3://tidemq-archive/prod/{group}"
        assert flag(c["args"], "--archive-s3-endpoint") == "https://minio.example:9000"
        env = _env(c)
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            assert env[key]["valueFrom"] == {"secretKeyRef": {"name": "tidemq-s3", "key": key}}
        assert env["AWS_REGION"]["value"] == "eu-west-1"
        assert "archive" not in {v["name"] for v in pod["volumes"]}
        assert "initContainers" not in pod
    configs = _archive_config(S3, tmp_path)
    assert configs == {
        g: ArchiveConfig(
            f"s3://tidemq-archive/prod/{g}",
            default_policy="delete",
            compression="none",
            cache_bytes=536870912,
            interval_ms=2000,
            s3_endpoint_url="https://minio.example:9000",
        )
        for g in GROUPS
    }


def test_an_s3_archive_on_the_pods_own_identity_gets_no_credentials() -> None:
    values = {
        "archive": {"enabled": True, "uri": "s3://tidemq-archive", "s3": {"useInstanceRole": True}},
        "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/mq"}},
    }
    (sts,) = broker_sets(_validated(values)).values()
    c = container(sts)
    assert flag(c["args"], "--archive-uri") == "s3://tidemq-archive/broker-a"
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"} & _env(c).keys()


@pytest.mark.parametrize("values", [DIRECTORY, S3], ids=["directory", "s3"])
def test_lint_strict(values: dict[str, Any]) -> None:
    done = run_helm("lint", "--strict", str(CHART), values=values)
    assert done.returncode == 0, done.stdout + done.stderr


def _archive(**archive: Any) -> dict[str, Any]:
    return {"archive": {"enabled": True, **archive}}


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            _archive(),
            "archive.enabled: say where the archive is: archive.uri (s3://BUCKET/PREFIX) or "
            "archive.volume.existingClaim",
        ),
        (
            _archive(uri="s3://tidemq-archive/prod"),
            "archive.uri is an S3 bucket: give its credentials in archive.s3.existingSecret (keys "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or set archive.s3.useInstanceRole=true",
        ),
        (
            _archive(uri="s3://", s3={"useInstanceRole": True}),
            "archive.uri: s3:// names no bucket (s3://BUCKET/PREFIX)",
        ),
        (
            _archive(uri="/srv/archive"),
            "archive.uri /srv/archive is a directory: mount one with archive.volume.existingClaim",
        ),
        (
            _archive(uri="archive"),
            "archive.uri: must be s3://BUCKET/PREFIX, file:///PATH or an absolute path, got "
            "archive",
        ),
        (
            _archive(uri="/srv/archive", volume={"existingClaim": "c"}),
            "archive.uri: the directory /srv/archive is not on the archive volume "
            "(archive.volume.mountPath /archive)",
        ),
        (
            _archive(uri="s3://b/p", s3={"existingSecret": "s"}, volume={"existingClaim": "c"}),
            "archive.volume.existingClaim: the archive is an S3 bucket (archive.uri); the volume "
            "would be unused",
        ),
        (
            _archive(volume={"existingClaim": "c", "mountPath": "/var/lib/tidemq/store/archive"}),
            "archive.volume.mountPath: /var/lib/tidemq/store/archive overlaps "
            "/var/lib/tidemq/store",
        ),
    ],
)
def test_an_archive_that_cannot_work_is_refused(values: dict[str, Any], expected: str) -> None:
    error = render_error(values)
    assert "VALUES VALIDATION" in error
    assert expected in error


def test_every_archive_problem_is_listed_at_once() -> None:
    error = render_error(
        {"archive": {"enabled": True, "uri": "s3://", "volume": {"existingClaim": "c"}}}
    )
    assert error.count("VALUES VALIDATION") == 1
    assert error.count("\n- archive.") == 3  # no bucket, no credentials, an unused volume


def test_the_archive_needs_nothing_while_it_is_off() -> None:
    render({"archive": {"enabled": False, "uri": "s3://tidemq-archive"}})


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {"archive": {"defaultPolicy": "keep"}},
            'archive.defaultPolicy must be one of the following: "archive", "delete"',
        ),
        (
            {"archive": {"compression": "gzip"}},
            'archive.compression must be one of the following: "zstd", "none"',
        ),
        (
            {"archive": {"cacheBytes": "256Mi"}},
            "archive.cacheBytes: Invalid type. Expected: integer, given: string",
        ),
        ({"archive": {"intervalMs": 0}}, "archive.intervalMs: Must be greater than or equal to 1"),
        ({"archive": {"volume": {"mountPath": "archive"}}}, "archive.volume.mountPath: Does not"),
        (
            {"archive": {"s3": {"secret": "x"}}},
            "archive.s3: Additional property secret is not allowed",
        ),
    ],
)
def test_archive_values_of_the_wrong_shape_fail_the_schema(
    values: dict[str, Any], expected: str
) -> None:
    error = render_error(values)
    assert "values don't meet the specifications of the schema" in error
    assert expected in error
