"""Validate rendered objects as a Kubernetes API server would, without one.

Built-in kinds go through kubernetes-validate in strict mode (unknown fields
are errors) for `KUBERNETES_VERSION`. Custom resources go through their CRD's
OpenAPI schema, vendored in `schemas/` (KubeRay's RayService, prometheus-
operator's ServiceMonitor; Apache-2.0, licenses beside them; for the Gateway
API's HTTPRoute and GRPCRoute, a subset schema of our own), made strict the
same way: an object schema with `properties` and no
`x-kubernetes-preserve-unknown-fields` rejects other fields, as
`kubectl apply --validate=strict` does. A RayService's `serveConfigV2` is also
parsed with Ray Serve's own config schema (`ServeDeploySchema`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

from services.deploy.chart import RenderedObject

# The version we validate for: current on the major managed services at the
# time of writing; the chart's kubeVersion allows >= 1.29.
KUBERNETES_VERSION = "1.33.0"
SCHEMA_DIR = Path(__file__).parent / "schemas"
CRD_SCHEMAS = {
    ("ray.io/v1", "RayService"): "ray.io_v1_rayservice.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_v1_servicemonitor.json",
    # NOTE: our subsets of Gateway API v1 (the upstream CRDs are not vendored): they catch a
    # misspelled or misplaced field of what the chart renders, not every rule of the real CRD.
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "gateway.networking.k8s.io_v1_httproute.subset.json",
    ("gateway.networking.k8s.io/v1", "GRPCRoute"): "gateway.networking.k8s.io_v1_grpcroute.subset.json",
}


@dataclass(frozen=True)
class Finding:
    """One validation error of one object."""

    ref: str  # Kind/name
    template: str
    message: str

    def __str__(self) -> str:
        return f"{self.ref} ({self.template}): {self.message}"


def strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of an OpenAPI v3 schema in which every object with `properties` (and no
    `x-kubernetes-preserve-unknown-fields`) rejects fields it does not list."""
    out = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(out)
    return out


@cache
def crd_validator(file_name: str) -> jsonschema.protocols.Validator:
    data = json.loads((SCHEMA_DIR / file_name).read_text())
    return jsonschema.Draft7Validator(strict_schema(data["schema"]))


def validate_object(obj: RenderedObject, version: str = KUBERNETES_VERSION) -> list[Finding]:
    """The object's errors (empty: valid)."""
    import kubernetes_validate

    key = (obj.obj.get("apiVersion", ""), obj.kind)
    if key in CRD_SCHEMAS:
        validator = crd_validator(CRD_SCHEMAS[key])
        findings = [Finding(obj.ref, obj.template, f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}")
                    for e in sorted(validator.iter_errors(obj.obj), key=lambda e: list(map(str, e.absolute_path)))]
        if obj.kind == "RayService":
            findings += [Finding(obj.ref, obj.template, m) for m in serve_config_errors(obj.obj)]
        return findings
    try:
        kubernetes_validate.validate(obj.obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(map(str, exc.path)) or "<root>"
        return [Finding(obj.ref, obj.template, f"{path}: {exc.message}")]
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as exc:
        return [Finding(obj.ref, obj.template, f"no schema for {key[0]} {key[1]} in Kubernetes {version}: {exc}")]
    return []


def serve_config_errors(rayservice: dict[str, Any]) -> list[str]:
    """Errors of a RayService's serveConfigV2 under Ray Serve's config schema."""
    import yaml
    from ray.serve.schema import ServeDeploySchema

    text = rayservice.get("spec", {}).get("serveConfigV2")
    if not text:
        return ["spec.serveConfigV2 is missing"]
    config = yaml.safe_load(text)
    try:
        ServeDeploySchema.model_validate(config)
    except Exception as exc:  # pydantic's ValidationError
        return [f"serveConfigV2: {exc}"]
    # Serve ignores keys it does not know; a typo there would silently do nothing.
    return [f"serveConfigV2: unknown key {path}" for path in unknown_keys(ServeDeploySchema, config)]


def unknown_keys(model, data: Any, path: str = "") -> list[str]:
    """Keys of `data` (a dict for pydantic `model`) that the model and its nested models lack."""
    if not isinstance(data, dict):
        return []
    fields = model.model_fields
    names = {n for n, f in fields.items()} | {f.alias for f in fields.values() if f.alias}
    out = [f"{path}{key}" for key in data if key not in names]
    for name, field in fields.items():
        value = data.get(field.alias or name, data.get(name))
        for nested in _models_in(field.annotation):
            if isinstance(value, dict):
                out += unknown_keys(nested, value, f"{path}{name}.")
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    out += unknown_keys(nested, item, f"{path}{name}[{i}].")
    return out


def _models_in(annotation) -> list:
    """Pydantic model classes inside an annotation (Optional[...], List[...], unions)."""
    from typing import get_args

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def validate_objects(objects: Sequence[RenderedObject], version: str = KUBERNETES_VERSION) -> list[Finding]:
    """Every object's errors, in order."""
    return [f for obj in objects for f in validate_object(obj, version)]
