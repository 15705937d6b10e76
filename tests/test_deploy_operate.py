"""What the chart adds to operate a release: the edges (Ingress, HTTPRoute, GRPCRoute behind
flags), a PodDisruptionBudget for the engine's workers, the engine's metrics scraped and the
Grafana dashboard (whose queries name series the code exports), /dev/shm for Ray, the model
cache on a claim, and the OpenAI settings of the gateway."""

from __future__ import annotations

import json
import re

import pytest

from tests.deploy_helpers import ALL_ON, IMAGE, component_of, containers, matches, pod_templates, render

from services.deploy.chart import ChartValuesError, RenderedObject, render_chart  # noqa: E402
from services.deploy.validate import validate_object  # noqa: E402


def _one(objects, kind: str, component: str | None = None) -> RenderedObject:
    (found,) = [o for o in objects if o.kind == kind and (component is None or component_of(o) == component)]
    return found


def _ports(service: dict) -> dict[str, int]:
    return {p["name"]: p["port"] for p in service["spec"]["ports"]}


def test_edges_point_at_the_gateway_service_ports():
    objects = render(ALL_ON)
    service = _one(objects, "Service", "gateway").obj
    ports = _ports(service)
    ingress = _one(objects, "Ingress").obj["spec"]
    backend = ingress["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert (backend["name"], backend["port"]["name"]) == (service["metadata"]["name"], "http")
    assert ingress["rules"][0]["host"] == "sql.example.com" and ingress["tls"][0]["secretName"] == "sql-example-tls"
    http, grpc = _one(objects, "HTTPRoute").obj["spec"], _one(objects, "GRPCRoute").obj["spec"]
    assert http["parentRefs"] == grpc["parentRefs"] == [{"name": "public"}]
    assert http["rules"][0]["backendRefs"] == [{"name": service["metadata"]["name"], "port": ports["http"]}]
    assert grpc["rules"][0]["backendRefs"] == [{"name": service["metadata"]["name"], "port": ports["grpc"]}]
    assert {"method": {"service": "headstart.v1.Headstart"}} in grpc["rules"][0]["matches"]


def test_edges_are_off_by_default_and_a_route_needs_its_gateway():
    assert not {o.kind for o in render()} & {"Ingress", "HTTPRoute", "GRPCRoute"}
    with pytest.raises(ChartValuesError, match="name"):
        render_chart(sets=(IMAGE, "gateway.gatewayApi.grpcRoute.enabled=true"))


@pytest.mark.parametrize("kind, path", [("HTTPRoute", ["spec", "rules", 0, "backendRef"]),
                                        ("GRPCRoute", ["spec", "parentRef"])])
def test_the_route_schemas_catch_a_misspelled_field(kind, path):
    obj = _one(render(ALL_ON), kind)
    data = json.loads(json.dumps(obj.obj))
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = []
    findings = validate_object(RenderedObject(obj.template, data))
    assert findings and path[-1] in findings[0].message


def test_engine_workers_have_a_disruption_budget_that_spares_the_head():
    objects = render()
    pdb = _one(objects, "PodDisruptionBudget", "engine").obj["spec"]
    assert pdb["maxUnavailable"] == 1
    ray = _one(objects, "RayService")
    head, worker = pod_templates(ray)
    assert matches(pdb["selector"], worker["metadata"]["labels"])
    assert not matches(pdb["selector"], head["metadata"]["labels"])


def test_ray_metrics_are_scraped_from_every_ray_pod():
    objects = render(ALL_ON)
    monitor = _one(objects, "ServiceMonitor", "engine-metrics").obj["spec"]
    service = _one(objects, "Service", "engine-metrics").obj
    assert matches(monitor["selector"], service["metadata"]["labels"])
    assert not matches(monitor["selector"], _one(objects, "Service", "gateway").obj["metadata"]["labels"])
    assert monitor["endpoints"][0]["port"] == "metrics" and service["spec"]["clusterIP"] == "None"
    ray = _one(objects, "RayService")
    for template in pod_templates(ray):
        assert matches({"matchLabels": service["spec"]["selector"]}, template["metadata"]["labels"])
        (container,) = template["spec"]["containers"]
        assert {"name": "metrics", "containerPort": 8080} in container["ports"]
    cluster = ray.obj["spec"]["rayClusterConfig"]
    assert cluster["headGroupSpec"]["rayStartParams"]["metrics-export-port"] == "8080"
    assert cluster["workerGroupSpecs"][0]["rayStartParams"]["metrics-export-port"] == "8080"


def test_the_dashboard_charts_series_the_code_exports():
    from services.gateway.metrics import GatewayMetrics
    from services.engine.kv_metrics import __file__ as kv_metrics_file

    config = _one(render(ALL_ON), "ConfigMap", "dashboard").obj
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(config["data"]["headstart.json"])
    titles = " / ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in ("ttft", "complete sql", "cached at submit", "kv cache bytes", "sessions", "refusals"):
        assert topic in titles, topic
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    names = set(re.findall(r"\b((?:ray_)?headstart_[a-z_]+)", exprs))
    gateway = GatewayMetrics()
    gateway.observe_result("session", type("R", (), {"total_ms": 1.0, "prompt_tokens": 2,
                                                     "cached_tokens_at_submit": 2,
                                                     "computed_tokens_at_submit": 0})())
    exported = gateway.render().decode()
    kv_source = open(kv_metrics_file).read()
    for name in names:
        if name.startswith("ray_"):  # Ray prefixes a replica's own metrics with ray_
            assert f'"{name.removeprefix("ray_")}"' in kv_source, name
        else:  # declared by the gateway (a labelled series has no sample before its first event)
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert re.search(rf"^# TYPE {base} ", exported, re.M), name


def test_ray_pods_get_a_memory_backed_dev_shm():
    ray = _one(render(), "RayService")
    for template in pod_templates(ray):
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        mounts = {m["name"]: m for m in template["spec"]["containers"][0]["volumeMounts"]}
        assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
        assert mounts["dshm"]["mountPath"] == "/dev/shm"


@pytest.mark.parametrize("sets, claim", [((), "headstart-model-cache"),
                                         (("model.cache.existingClaim=my-models",), "my-models"),
                                         (("model.cache.enabled=false",), None)])
def test_the_model_cache_is_a_claim_shared_by_the_model_loaders(sets, claim):
    objects = render(sets)
    pvcs = [o for o in objects if o.kind == "PersistentVolumeClaim"]
    assert [o.name for o in pvcs] == (["headstart-model-cache"] if claim == "headstart-model-cache" else [])
    if pvcs:
        assert pvcs[0].obj["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert pvcs[0].obj["spec"]["accessModes"] == ["ReadWriteMany"]
    loaders = [o for o in objects if o.kind == "RayService" or (o.kind == "Deployment"
                                                               and component_of(o) == "tablecache")]
    for obj in loaders:
        for spec, container in containers(obj):
            cache = next(v for v in spec["volumes"] if v["name"] == "model-cache")
            if claim:
                assert cache["persistentVolumeClaim"] == {"claimName": claim}
            else:
                assert "emptyDir" in cache
            if "volumeMounts" in container:
                env = {e["name"]: e.get("value") for e in container.get("env", [])}
                if "HF_HOME" in env:
                    assert any(m["name"] == "model-cache" and env["HF_HOME"].startswith(m["mountPath"])
                               for m in container["volumeMounts"])


def test_the_gateway_serves_the_models_id_on_the_openai_api():
    from services.gateway.settings import GatewaySettings

    config = _one(render(("gateway.openaiDatabase=world_1",)), "ConfigMap", "gateway").obj["data"]
    assert config["HEADSTART_GATEWAY_SERVED_MODEL"] == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    assert config["HEADSTART_GATEWAY_OPENAI_DATABASE"] == "world_1"
    named = _one(render(("model.servedName=qwen2.5-coder-0.5b-instruct",)), "ConfigMap", "gateway").obj["data"]
    assert named["HEADSTART_GATEWAY_SERVED_MODEL"] == "qwen2.5-coder-0.5b-instruct"
    settings = GatewaySettings(**{k.removeprefix("HEADSTART_GATEWAY_").lower(): v for k, v in config.items()})
    assert settings.served_model == "Qwen/Qwen2.5-Coder-0.5B-Instruct"


def test_the_image_spider_databases_are_served_unless_turned_off():
    def env_of(objects):
        return [{e["name"]: e.get("value") for e in c.get("env", [])}
                for o in objects if o.kind in ("Deployment", "RayService")
                and component_of(o) in ("gateway", "engine") for _, c in containers(o)]

    assert all("HEADSTART_CATALOGUE_SPIDER" not in env for env in env_of(render()))
    assert all(env["HEADSTART_CATALOGUE_SPIDER"] == "0" for env in env_of(render(("catalogue.spider.builtin=false",))))


def test_the_alert_rules_use_series_the_code_exports():
    """deploy/helm/headstart/alerts/headstart-rules.yaml: every rule complete, and every series it
    reads declared by the gateway's /metrics (its own and the replicas' it learns)."""
    import yaml
    from prometheus_client import CollectorRegistry, generate_latest

    from services.deploy.chart import CHART_DIR
    from services.gateway.engine_kv import EngineKVGauges
    from services.gateway.metrics import GatewayMetrics

    rules = yaml.safe_load((CHART_DIR / "alerts" / "headstart-rules.yaml").read_text())
    (group,) = rules["groups"]
    assert group["rules"]
    gateway = GatewayMetrics()
    engines = CollectorRegistry()
    EngineKVGauges(engines)
    exported = gateway.render().decode() + generate_latest(engines).decode()
    for rule in group["rules"]:
        assert rule["alert"].startswith("Headstart") and rule["for"] and rule["labels"]["severity"], rule
        assert rule["annotations"]["summary"], rule
        for name in re.findall(r"\b(headstart_[a-z_]+)", rule["expr"]):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert re.search(rf"^# TYPE {base} ", exported, re.M), name
