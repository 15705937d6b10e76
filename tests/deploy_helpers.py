"""Renders of the Helm chart shared by the tests/test_deploy_*.py files (cached: a render
takes about a second), and the pod templates and containers of rendered objects."""

from __future__ import annotations

from functools import lru_cache

import pytest

pytest.importorskip("helm_python", reason="the `deploy` extra (helm-python-sdk) is not installed")

from services.deploy.chart import RenderedObject, render_chart  # noqa: E402

COMPONENTS = ("gateway", "engine", "tablecache", "flash", "redis")
# The one value a default install must name: where the user pushed the image (the chart fails without it).
IMAGE = "image.repository=registry.example/headstart"
# Every optional object on (ServiceMonitor, autoscaling, monitoring namespace, a database to register,
# catalogue volumes and a catalogue DSN Secret).
ALL_ON = (
    "metrics.serviceMonitor.enabled=true",
    "engine.autoscaling.enabled=true",
    "metrics.dashboard.enabled=true",
    "gateway.ingress.enabled=true",
    "gateway.ingress.host=sql.example.com",
    "gateway.ingress.tlsSecretName=sql-example-tls",
    "gateway.gatewayApi.parentRef.name=public",
    "gateway.gatewayApi.httpRoute.enabled=true",
    "gateway.gatewayApi.grpcRoute.enabled=true",
    "networkPolicy.monitoringNamespace.kubernetes\\.io/metadata\\.name=monitoring",
    "tablecache.databases={concert_singer}",
    "model.hfToken.secretName=hf-token",
    "catalogue.sqlite.claimName=sqlite-dbs",
    "catalogue.spider.claimName=spider-data",
    "catalogue.postgres.dsns.sales=postgresql://reader:all-on-pw-0cc175b9c0@pg.example:5432/sales",
)


@lru_cache(maxsize=None)
def render(sets: tuple[str, ...] = (), values_files: tuple[str, ...] = ()) -> tuple[RenderedObject, ...]:
    """The chart with `values_files` and `sets` over a default install (the image named)."""
    return tuple(render_chart(values_files, (IMAGE, *sets)))


def component_of(obj: RenderedObject) -> str:
    return obj.obj["metadata"]["labels"]["app.kubernetes.io/component"]


def pod_templates(obj: RenderedObject) -> list[dict]:
    """The pod templates an object creates pods from (a RayService: head and worker groups)."""
    spec = obj.obj.get("spec", {})
    if obj.kind in ("Deployment", "StatefulSet", "Job"):
        return [spec["template"]]
    if obj.kind == "RayService":
        cluster = spec["rayClusterConfig"]
        return [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    return []


def containers(obj: RenderedObject) -> list[tuple[dict, dict]]:
    """(pod spec, container) of every container and init container of the object."""
    return [(t["spec"], c) for t in pod_templates(obj)
            for c in t["spec"].get("initContainers", []) + t["spec"]["containers"]]


def matches(selector: dict, labels: dict) -> bool:
    """A label selector (matchLabels and matchExpressions) against a label set."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True
