"""helm/tidemq/values.schema.json: Helm checks values against it on install, upgrade, template
and lint, so a mistyped key or a value of the wrong type fails before anything renders. It must
describe exactly the keys of values.yaml: walked here both ways so the two cannot drift."""

from __future__ import annotations

import json
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # no stubs; a test-only use
import pytest
import yaml

from tests.deploy.chart import CHART, helm_binary, render_error
from tests.deploy.conftest import VALUE_SETS

pytestmark = [
    pytest.mark.deploy,
    pytest.mark.skipif(helm_binary() is None, reason="helm is not installed: run `make tools`"),
]

SCHEMA: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
VALUES: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
SCHEMA_ERROR = "values don't meet the specifications of the schema(s)"


def _walk(values: Any, schema: dict[str, Any], path: str, problems: list[str]) -> None:
    """Compare one level of values.yaml with its schema node, and recurse where the schema lists
    properties. A node without ``properties`` is a map passed through to Kubernetes (resources,
    affinity, annotations, broker.config, ...): its keys are the user's, not the chart's."""
    kind = schema.get("type")
    if isinstance(values, dict):
        if kind != "object":
            problems.append(f"{path or '(root)'}: a map in values.yaml, {kind!r} in the schema")
            return
        properties = schema.get("properties")
        if properties is None:
            if schema.get("additionalProperties") is False:
                problems.append(f"{path}: refuses every key, values.yaml has {sorted(values)}")
            return
        for key in values.keys() - properties.keys():
            problems.append(f"{path}{key}: in values.yaml, not in the schema")
        for key in properties.keys() - values.keys():
            problems.append(f"{path}{key}: in the schema, not in values.yaml")
        if schema.get("additionalProperties") is not False and path.rstrip(".") not in (
            # Kubernetes' security contexts: the chart types its own keys, and lets others through.
            "podSecurityContext",
            "containerSecurityContext",
        ):
            problems.append(f"{path or '(root)'}: a mistyped key would pass (additionalProperties)")
        for key in values.keys() & properties.keys():
            _walk(values[key], properties[key], f"{path}{key}.", problems)
    elif not schema.get("type"):
        problems.append(f"{path[:-1]}: no type in the schema")


def test_the_schema_and_values_yaml_have_the_same_keys() -> None:
    problems: list[str] = []
    _walk(VALUES, SCHEMA, "", problems)
    assert not problems, "\n".join(sorted(problems))


def test_every_key_of_the_schema_is_described_as_values_yaml_documents_it() -> None:
    """Descriptions come from the ``## @param`` lines: a key documented there is described."""
    documented = {
        line.split()[2]
        for line in (CHART / "values.yaml").read_text().splitlines()
        if line.strip().startswith("## @param ")
    }

    def undescribed(schema: dict[str, Any], path: str) -> list[str]:
        missing = [path] if path in documented and not schema.get("description") else []
        for key, child in schema.get("properties", {}).items():
            missing += undescribed(child, f"{path}.{key}" if path else key)
        return missing

    assert not undescribed(SCHEMA, "")


def test_the_schema_is_draft_07_and_accepts_the_defaults_and_every_value_set() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    assert SCHEMA["$schema"] == "http://json-schema.org/draft-07/schema#"
    validator = jsonschema.Draft7Validator(SCHEMA)
    for name, values in {"values.yaml": VALUES, **VALUE_SETS}.items():
        merged = _merge(VALUES, values)
        errors = [
            f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(merged)
        ]
        assert not errors, f"{name}: {errors}"


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """What Helm does with a values file over the chart's values.yaml (maps merge, the rest is
    replaced)."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merged[key] = _merge(base[key], value)
        else:
            merged[key] = value
    return merged


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {"broker": {"replicaton": "SYNC"}},
            "- broker: Additional property replicaton is not allowed",
        ),
        (
            {"extrnalAccess": {"enabled": True}},
            "- (root): Additional property extrnalAccess is not allowed",
        ),
        (
            {"broker": {"persistence": {"sizee": "50Gi"}}},
            "- broker.persistence: Additional property sizee is not allowed",
        ),
        (
            {"nameserver": {"livenessProbe": {"periodSecond": 5}}},
            "- nameserver.livenessProbe: Additional property periodSecond is not allowed",
        ),
        (
            {"externalAccess": {"service": {"nodeports": [31000]}}},
            "- externalAccess.service: Additional property nodeports is not allowed",
        ),
    ],
)
def test_a_mistyped_key_fails_with_helms_schema_message(
    values: dict[str, Any], expected: str
) -> None:
    error = render_error(values)
    assert SCHEMA_ERROR in error
    assert expected in error


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {"broker": {"groups": "3"}},
            "- broker.groups: Invalid type. Expected: integer, given: string",
        ),
        (
            {"tls": {"enabled": "yes"}},
            "- tls.enabled: Invalid type. Expected: boolean, given: string",
        ),
        ({"broker": {"groups": 27}}, "- broker.groups: Must be less than or equal to 26"),
        (
            {"broker": {"extraArgs": "--flag"}},
            "- broker.extraArgs: Invalid type. Expected: array, given: string",
        ),
        (
            {"externalAccess": {"service": {"type": "ClusterIP"}}},
            "- externalAccess.service.type: externalAccess.service.type must be one of the"
            ' following: "LoadBalancer", "NodePort"',
        ),
        (
            {"externalAccess": {"service": {"nodePorts": [30001, "x"]}}},
            "- externalAccess.service.nodePorts.1: Invalid type. Expected: integer, given: string",
        ),
        (
            {"image": {"pullPolicy": "Sometimes"}},
            "- image.pullPolicy: image.pullPolicy must be one of the following",
        ),
        (
            {"broker": {"topologySpreadPreset": "rack"}},
            "- broker.topologySpreadPreset: broker.topologySpreadPreset must be one of the"
            ' following: "", "zone", "hostname"',
        ),
    ],
)
def test_a_value_of_the_wrong_type_fails_with_helms_schema_message(
    values: dict[str, Any], expected: str
) -> None:
    error = render_error(values)
    assert SCHEMA_ERROR in error
    assert expected in error
