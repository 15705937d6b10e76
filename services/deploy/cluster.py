"""A release's state in a cluster, read with the `kubernetes` Python client.

`release_status(client, namespace, release)` lists each component's rollout
(Deployments, StatefulSets, the registration Job) and the engine's RayService,
found by the chart's labels. The verdicts (`rollout_of`, `rayservice_of`,
`job_of`) are pure functions of the API objects (as dicts), so they are tested
against recorded API responses without a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CHART_NAME = "headstart"


@dataclass(frozen=True)
class ComponentStatus:
    """One object's rollout: `ready` when it serves at its desired generation."""

    component: str
    ref: str  # Kind/name
    ready: bool
    detail: str


def release_selector(release: str) -> str:
    """The label selector of every object of a release."""
    return f"app.kubernetes.io/name={CHART_NAME},app.kubernetes.io/instance={release}"


def _component(obj: dict[str, Any]) -> str:
    return obj.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component", "?")


def rollout_of(kind: str, obj: dict[str, Any]) -> ComponentStatus:
    """A Deployment's or StatefulSet's rollout: every replica updated and ready, and the
    controller has seen the newest spec (observedGeneration)."""
    meta, spec, status = obj.get("metadata", {}), obj.get("spec", {}), obj.get("status", {}) or {}
    want = spec.get("replicas", 1)
    ready = status.get("readyReplicas", 0) or 0
    updated = status.get("updatedReplicas", 0) or 0
    seen = (status.get("observedGeneration") or 0) >= (meta.get("generation") or 0)
    ok = seen and ready >= want and updated >= want
    detail = f"{ready}/{want} ready, {updated} updated" + ("" if seen else ", spec not yet observed")
    return ComponentStatus(_component(obj), f"{kind}/{meta.get('name')}", ok, detail)


def rayservice_of(obj: dict[str, Any]) -> ComponentStatus:
    """A RayService is ready when its `Ready` condition is True (KubeRay >= 1.3), or, from
    older operators, when `serviceStatus` is Running."""
    meta, status = obj.get("metadata", {}), obj.get("status", {}) or {}
    conditions = {c.get("type"): c for c in status.get("conditions", []) or []}
    ready_cond = conditions.get("Ready")
    if ready_cond is not None:
        ok = ready_cond.get("status") == "True"
        detail = f"Ready={ready_cond.get('status')} ({ready_cond.get('reason', '')})"
    else:
        ok = status.get("serviceStatus") == "Running"
        detail = f"serviceStatus={status.get('serviceStatus', 'unknown')}"
    apps = (status.get("activeServiceStatus", {}) or {}).get("applicationStatuses", {}) or {}
    if apps:
        detail += "; apps " + ", ".join(f"{name}={app.get('status')}" for name, app in sorted(apps.items()))
        ok = ok and all(app.get("status") == "RUNNING" for app in apps.values())
    if status.get("numServeEndpoints") is not None:
        detail += f"; {status['numServeEndpoints']} serve endpoint(s)"
    return ComponentStatus(_component(obj), f"RayService/{meta.get('name')}", ok, detail)


def job_of(obj: dict[str, Any]) -> ComponentStatus:
    """A Job is done when it succeeded; failing pods are reported with their count."""
    meta, status = obj.get("metadata", {}), obj.get("status", {}) or {}
    succeeded, failed = status.get("succeeded", 0) or 0, status.get("failed", 0) or 0
    active = status.get("active", 0) or 0
    detail = f"succeeded={succeeded} failed={failed} active={active}"
    return ComponentStatus(_component(obj), f"Job/{meta.get('name')}", succeeded > 0, detail)


def release_status(api_client, namespace: str, release: str) -> list[ComponentStatus]:
    """Every component of `release` in `namespace` (a 404 on RayServices: KubeRay is missing)."""
    from kubernetes import client

    selector = release_selector(release)
    apps, batch = client.AppsV1Api(api_client), client.BatchV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    out: list[ComponentStatus] = []
    for kind, lister in (("Deployment", apps.list_namespaced_deployment),
                         ("StatefulSet", apps.list_namespaced_stateful_set)):
        for item in lister(namespace, label_selector=selector).items:
            out.append(rollout_of(kind, api_client.sanitize_for_serialization(item)))
    try:
        services = custom.list_namespaced_custom_object("ray.io", "v1", namespace, "rayservices",
                                                        label_selector=selector)
        out += [rayservice_of(item) for item in services.get("items", [])]
    except client.ApiException as exc:
        if exc.status != 404:
            raise
        out.append(ComponentStatus("engine", "RayService/*", False, "ray.io/v1 not served: is KubeRay installed?"))
    for item in batch.list_namespaced_job(namespace, label_selector=selector).items:
        out.append(job_of(api_client.sanitize_for_serialization(item)))
    return out


def gateway_pod(api_client, namespace: str, release: str) -> str:
    """Name of a ready gateway pod of the release (the one `smoke` port-forwards to).

    Raises:
        LookupError: no gateway pod is ready.
    """
    from kubernetes import client

    pods = client.CoreV1Api(api_client).list_namespaced_pod(
        namespace, label_selector=release_selector(release) + ",app.kubernetes.io/component=gateway")
    for pod in pods.items:
        conditions = {c.type: c.status for c in (pod.status.conditions or [])}
        if pod.status.phase == "Running" and conditions.get("Ready") == "True":
            return pod.metadata.name
    raise LookupError(f"no ready gateway pod of release {release!r} in namespace {namespace!r}")
