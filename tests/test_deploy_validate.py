"""Every rendered manifest validates strictly (kubernetes-validate for built-in kinds, the
vendored CRD schemas for RayService and ServiceMonitor, Ray Serve's schema for the serve
config); the validator does catch what it must; the names the manifests carry (import
path, router class, servicer functions, settings keys) exist in the code."""

from __future__ import annotations

import copy
import importlib

import pytest
import yaml

from tests.deploy_helpers import ALL_ON, component_of, render

from services.deploy.chart import CHART_DIR, RenderedObject  # noqa: E402
from services.deploy.validate import KUBERNETES_VERSION, validate_object, validate_objects  # noqa: E402

GPU_VALUES = str(CHART_DIR.parent / "examples" / "gpu-values.yaml")
RENDERS = {
    "defaults": ((), ()),
    "all-on": (ALL_ON, ()),
    "gpu example": ((), (GPU_VALUES,)),
    "pvc model, external redis": (("model.source=pvc", "model.pvc.claimName=models", "model.pvc.path=qwen-7b",
                                   "redis.enabled=false", "redis.external.existingSecret=redis-url"), ()),
    "gateway off": (("gateway.enabled=false",), ()),
    "engine off": (("engine.enabled=false",), ()),
    "tablecache off": (("tablecache.enabled=false",), ()),
    "flash off": (("flash.enabled=false",), ()),
}


@pytest.mark.parametrize("name", list(RENDERS))
def test_every_manifest_validates_strictly(name):
    sets, files = RENDERS[name]
    objects = render(sets, files)
    assert validate_objects(objects) == []


def _one(kind: str, sets=ALL_ON) -> RenderedObject:
    return next(o for o in render(sets) if o.kind == kind)


def _with(obj: RenderedObject, path: list, value) -> RenderedObject:
    data = copy.deepcopy(obj.obj)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return RenderedObject(obj.template, data)


@pytest.mark.parametrize("kind, path, value, words", [
    ("Deployment", ["spec", "replicaz"], 2, "replicaz"),
    ("Deployment", ["spec", "template", "spec", "containers", 0, "imagePullPolicy"], 3, "imagePullPolicy"),
    ("NetworkPolicy", ["spec", "podSelectr"], {}, "podSelectr"),
    ("StatefulSet", ["spec", "replicas"], "one", "replicas"),
    ("RayService", ["spec", "rayClusterConfig", "workerGroupSpecs", 0, "replicaz"], 2, "replicaz"),
    ("RayService", ["spec", "rayClusterConfig", "headGroupSpec", "rayStartParams", "num-cpus"], 0, "num-cpus"),
    ("RayService", ["spec", "serveConfigV2"], "applications:\n- name: x\n  import_path: a:b\n  numreplicas: 2\n",
     "serveConfigV2"),
    ("RayService", ["spec", "serveConfigV2"],
     "applications:\n- name: x\n  import_path: a:b\n  deployments:\n  - name: E\n    num_replicas: two\n",
     "num_replicas"),
    ("ServiceMonitor", ["spec", "endpoints", 0, "intervall"], "30s", "intervall"),
])
def test_the_validator_rejects_unknown_fields_and_wrong_types(kind, path, value, words):
    obj = _one(kind)
    assert validate_object(obj) == []
    findings = validate_object(_with(obj, path, value))
    assert findings and any(words in str(f) for f in findings), findings


def test_we_validate_for_a_kubernetes_version_the_validator_knows():
    import kubernetes_validate.utils as kv

    assert KUBERNETES_VERSION in kv.all_versions()


def _serve_config(sets=()) -> dict:
    return yaml.safe_load(_one("RayService", sets).obj["spec"]["serveConfigV2"])


def _import(path: str):
    module, _, attr = path.replace(":", ".").rpartition(".")
    return getattr(importlib.import_module(module), attr)


def test_serve_config_names_code_that_exists():
    config = _serve_config()
    app = config["applications"][0]
    builder = _import(app["import_path"])
    assert callable(builder)
    router = _import(app["deployments"][0]["request_router_config"]["request_router_class"])
    from ray.serve.request_router import RequestRouter

    assert issubclass(router, RequestRouter)
    for path in config["grpc_options"]["grpc_servicer_functions"]:
        assert callable(_import(path))
    # the engine's own deployment uses the same router and servicers
    from services.engine.deployment import APP_NAME, ROUTER_CLASS, SERVICER_FUNCTIONS

    assert (app["name"], app["deployments"][0]["request_router_config"]["request_router_class"]) == \
        (APP_NAME, ROUTER_CLASS)
    assert config["grpc_options"]["grpc_servicer_functions"] == SERVICER_FUNCTIONS


@pytest.mark.parametrize("sets", [(), ("engine.device=cuda", "engine.gpusPerReplica=1", "engine.threads=4",
                                       "tableCache.cpuTierBytes=1000000")])
def test_serve_config_args_build_the_engine_app(sets):
    """The builder accepts the rendered args: EngineSettings takes every setting, and Serve
    gets an application of the Engine deployment (no replica is started)."""
    from ray.serve.deployment import Application

    app = _serve_config(sets)["applications"][0]
    from services.engine.serve_app import EngineAppArgs, build_app

    built = build_app(app["args"])
    assert isinstance(built, Application)
    from headstart.config import EngineSettings

    settings = EngineSettings(**EngineAppArgs(**app["args"]).settings)
    assert settings.model == app["args"]["settings"]["model"] and settings.table_precompute_on_open is False


def test_serve_app_args_reject_unknown_keys():
    from pydantic import ValidationError

    from services.engine.serve_app import build_app

    with pytest.raises(ValidationError, match="replcas"):
        build_app({"settings": {}, "replcas": 2})
    with pytest.raises(ValidationError, match="modle"):
        build_app({"settings": {"modle": "x"}})


def _configmap(component: str) -> dict[str, str]:
    return next(o for o in render() if o.kind == "ConfigMap" and component_of(o) == component).obj["data"]


def test_configmaps_hold_valid_settings(monkeypatch):
    """The ConfigMaps' keys are settings the processes accept (extra keys are errors there)."""
    from headstart.config import EngineSettings
    from services.gateway.settings import GatewaySettings
    from services.tablecache.settings import TableCacheSettings

    for name, value in {**_configmap("gateway"), "HEADSTART_GATEWAY_TOKENS": '{"t0123456789abcdef": "acme"}'}.items():
        monkeypatch.setenv(name, value)
    gateway = GatewaySettings()
    assert (gateway.host, gateway.port, gateway.grpc_port) == ("0.0.0.0", 8080, 50051)
    assert gateway.engine_target == "headstart-engine-serve:9000" and gateway.tokens == {"t0123456789abcdef": "acme"}
    for name, value in _configmap("tablecache").items():
        monkeypatch.setenv(name, value)
    engine, cache = EngineSettings(), TableCacheSettings()
    assert (engine.model, engine.dtype, engine.table_cache) == ("Qwen/Qwen2.5-Coder-0.5B-Instruct", "float32", "pfk")
    assert (cache.host, cache.port, cache.check_interval_s) == ("0.0.0.0", 50061, 300.0)
    for key in _configmap("gateway"):
        assert key.removeprefix("HEADSTART_GATEWAY_").lower() in GatewaySettings.model_fields, key
    for key in _configmap("tablecache"):
        field = key.removeprefix("HEADSTART_TABLECACHE_") if key.startswith("HEADSTART_TABLECACHE_") \
            else key.removeprefix("HEADSTART_")
        owner = TableCacheSettings if key.startswith("HEADSTART_TABLECACHE_") else EngineSettings
        assert field.lower() in owner.model_fields, key


def test_commands_of_the_pods_exist():
    """`python -m MODULE` of every headstart container names a runnable module."""
    import importlib.util

    commands = [c["command"] for o in render(ALL_ON) if o.obj.get("spec", {}).get("template")
                for c in o.obj["spec"]["template"]["spec"]["containers"] if c.get("command", [])[:2] == ["python", "-m"]]
    assert len(commands) == 4  # gateway, table cache, registration Job, flash worker
    for command in commands:
        spec = importlib.util.find_spec(command[2])
        if spec is not None and spec.submodule_search_locations:  # a package: python -m runs its __main__
            spec = importlib.util.find_spec(command[2] + ".__main__")
        assert spec is not None, command
