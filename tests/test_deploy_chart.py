"""The Helm chart renders (defaults, every component on, each one off), lints clean, and
rejects misspelled or mistyped values with a message naming the key."""

from __future__ import annotations

import pytest

from tests.deploy_helpers import ALL_ON, COMPONENTS, IMAGE, component_of, containers, render

from services.deploy.chart import CHART_DIR, ChartValuesError, lint_chart, render_chart  # noqa: E402

EXPECTED_DEFAULT = {
    ("gateway", "Deployment"), ("gateway", "Service"), ("gateway", "HorizontalPodAutoscaler"),
    ("gateway", "PodDisruptionBudget"), ("gateway", "ConfigMap"), ("gateway", "Secret"),
    ("gateway", "NetworkPolicy"),
    ("engine", "RayService"), ("engine", "NetworkPolicy"), ("engine-secret", "Secret"),
    ("tablecache", "Deployment"), ("tablecache", "Service"), ("tablecache", "ConfigMap"),
    ("tablecache", "NetworkPolicy"), ("tablecache-register", "Job"), ("tablecache-register", "Secret"),
    ("tablecache-register", "NetworkPolicy"),
    ("flash", "Deployment"), ("flash", "ConfigMap"), ("flash", "NetworkPolicy"),
    ("redis", "StatefulSet"), ("redis", "Service"), ("redis", "Secret"), ("redis", "NetworkPolicy"),
    ("engine", "PodDisruptionBudget"), ("model-cache", "PersistentVolumeClaim"),
}


def kinds(objects) -> set[tuple[str, str]]:
    return {(component_of(o), o.kind) for o in objects}


def test_defaults_render_every_component():
    assert kinds(render()) == EXPECTED_DEFAULT


def test_everything_on_adds_the_optional_objects():
    assert kinds(render(ALL_ON)) == EXPECTED_DEFAULT | {
        ("gateway", "ServiceMonitor"), ("catalogue", "Secret"), ("gateway", "Ingress"), ("gateway", "HTTPRoute"),
        ("gateway", "GRPCRoute"), ("engine-metrics", "Service"), ("engine-metrics", "ServiceMonitor"),
        ("dashboard", "ConfigMap")}


@pytest.mark.parametrize("component", COMPONENTS)
def test_a_component_off_omits_its_objects(component):
    sets = (f"{component}.enabled=false",)
    if component == "redis":
        sets += ("redis.external.url=redis://:pw@redis.example:6379/0",)
    objects = render(sets)
    present = {component_of(o) for o in objects}
    assert component not in present
    if component == "tablecache":
        assert "tablecache-register" not in present
    others = {c for c in COMPONENTS if c != component}
    assert others <= present
    if component == "redis":  # the external URL goes to a Secret of its own
        assert [o.ref for o in objects if component_of(o) == "redis-external"] == ["Secret/headstart-redis-external"]


def test_optional_gateway_objects_follow_their_flags():
    objects = render(("gateway.autoscaling.enabled=false", "gateway.podDisruptionBudget.enabled=false",
                      "networkPolicy.enabled=false", "engine.podDisruptionBudget.enabled=false"))
    found = {o.kind for o in objects}
    assert not found & {"HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy"}
    gateway = next(o for o in objects if o.kind == "Deployment" and component_of(o) == "gateway")
    assert gateway.obj["spec"]["replicas"] == 2


def test_no_redis_means_no_table_cache_in_the_engine():
    import yaml

    objects = render(("redis.enabled=false", "tablecache.enabled=false", "flash.enabled=false"))
    service = next(o for o in objects if o.kind == "RayService")
    settings = yaml.safe_load(service.obj["spec"]["serveConfigV2"])["applications"][0]["args"]["settings"]
    assert settings["table_cache"] == "off"
    env = service.obj["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    assert not {"HEADSTART_TABLE_STORE_URL", "HEADSTART_REDIS_URL"} & {e["name"] for e in env}


@pytest.mark.parametrize("sets, words", [
    (("redis.enabled=false",), "tablecache.enabled needs Redis"),
    (("redis.enabled=false", "tablecache.enabled=false"), "flash.enabled needs Redis"),
    (("tableCache.mode=off",), "tablecache.enabled needs tableCache.mode"),
])
def test_a_redis_user_without_its_needs_fails_clearly(sets, words):
    from services.deploy.chart import ChartError

    with pytest.raises(ChartError, match=words):
        render_chart(sets=(IMAGE, *sets))


@pytest.mark.parametrize("sets, words", [
    (("gateway.replcas=3",), ["/gateway", "replcas"]),
    (("enginee.replicas=3",), ["enginee"]),
    (("engine.worker.resorces.requests.cpu=1",), ["/engine/worker", "resorces"]),
    (("redis.persistence.sise=1Gi",), ["/redis/persistence", "sise"]),
    (("engine.gpusPerReplica=one",), ["/engine/gpusPerReplica", "integer"]),
    (("gateway.autoscaling.enabled=maybe",), ["/gateway/autoscaling/enabled", "boolean"]),
    (("model.dtype=float8",), ["/model/dtype"]),
    (("tableCache.mode=everything",), ["/tableCache/mode"]),
    (("gateway.service.grpcPort=70000",), ["/gateway/service/grpcPort"]),
    (("flash.replcas=2",), ["/flash", "replcas"]),
    (("flash.healthPort=0",), ["/flash/healthPort"]),
    (("containerSecurityContext.runAsNonRoot=false",), ["/containerSecurityContext/runAsNonRoot"]),
    (("model.source=pvc",), ["/model/pvc/claimName"]),
    (("gateway.ingress.hots=sql.example.com",), ["/gateway/ingress", "hots"]),
    (("gateway.gatewayApi.httpRoute.enable=true",), ["/gateway/gatewayApi/httpRoute", "enable"]),
    (("model.cache.sise=1Gi",), ["/model/cache", "sise"]),
    (("model.cache.accessMode=ReadMany",), ["/model/cache/accessMode"]),
    (("metrics.dashboard.enabeld=true",), ["/metrics/dashboard", "enabeld"]),
    (("engine.podDisruptionBudget.maxUnavailable=0",), ["/engine/podDisruptionBudget/maxUnavailable"]),
    (("engine.shmSizeLimit=lots",), ["/engine/shmSizeLimit"]),
])
def test_a_misspelled_or_mistyped_key_fails_naming_it(sets, words):
    with pytest.raises(ChartValuesError) as err:
        render_chart(sets=(IMAGE, *sets))
    for word in words:
        assert word in str(err.value)


def test_values_files_then_sets_in_order(tmp_path):
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("gateway:\n  replicas: 3\n  autoscaling:\n    enabled: false\n")
    second.write_text("gateway:\n  replicas: 4\n")
    objects = render_chart([first, second], [IMAGE, "gateway.replicas=5"])
    gateway = next(o for o in objects if o.kind == "Deployment" and component_of(o) == "gateway")
    assert gateway.obj["spec"]["replicas"] == 5
    assert next(o for o in render_chart([first, second], [IMAGE]) if o.name == gateway.name
                and o.kind == "Deployment").obj["spec"]["replicas"] == 4


def test_a_values_file_that_is_not_a_map_is_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ChartValuesError, match="map"):
        render_chart([bad])


@pytest.mark.parametrize("sets", [(), ALL_ON])
def test_helm_lint_strict_is_clean(sets):
    from services.deploy.chart import compose_values

    assert lint_chart(compose_values((), (IMAGE, *sets)), kube_version="v1.33.0") == []


def test_gpu_example_renders_two_gpu_replicas_with_external_redis():
    objects = render(values_files=(str(CHART_DIR.parent / "examples" / "gpu-values.yaml"),))
    assert "redis" not in {component_of(o) for o in objects if o.kind in ("StatefulSet", "Service")}
    service = next(o for o in objects if o.kind == "RayService")
    worker = service.obj["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert worker["replicas"] == 2
    limits = worker["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 1
    import yaml

    app = yaml.safe_load(service.obj["spec"]["serveConfigV2"])["applications"][0]
    assert app["args"]["settings"]["model"] == "Qwen/Qwen2.5-Coder-7B-Instruct"
    assert app["args"]["settings"]["dtype"] == "float32"
    assert app["deployments"][0]["num_replicas"] == 2
    assert app["deployments"][0]["ray_actor_options"]["num_gpus"] == 1


@pytest.mark.parametrize("sets, secret", [((), "headstart-redis"),
                                          (("redis.enabled=false", "redis.external.existingSecret=my-redis"),
                                           "my-redis")])
def test_flash_worker_and_replicas_share_the_redis_url_and_engine_secret(sets, secret):
    """The replicas publish data versions to the Redis the flash worker consumes and the gateway
    serves the data API from (one Secret key),
    the worker calls the engine's gRPC proxy with the engine secret, and its probes hit /healthz."""
    objects = render(sets)
    flash = next(o for o in objects if o.kind == "Deployment" and component_of(o) == "flash")
    (container,) = flash.obj["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    ray = next(o for o in objects if o.kind == "RayService")
    cluster = ray.obj["spec"]["rayClusterConfig"]
    for template in [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]:
        ray_env = {e["name"]: e for e in template["spec"]["containers"][0]["env"]}
        assert ray_env["HEADSTART_REDIS_URL"] == env["HEADSTART_REDIS_URL"]
    assert env["HEADSTART_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": secret, "key": "url"}
    gateway = next(o for o in objects if o.kind == "Deployment" and component_of(o) == "gateway")
    gateway_env = {e["name"]: e for e in gateway.obj["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert gateway_env["HEADSTART_REDIS_URL"] == env["HEADSTART_REDIS_URL"]  # the data API's rows and answers
    assert env["HEADSTART_ENGINE_SECRET_FILE"] == {"name": "HEADSTART_ENGINE_SECRET_FILE",
                                                  "value": "/etc/headstart/engine/secret"}
    assert container["command"] == ["python", "-m", "services.flash"]
    config = next(o for o in objects if o.kind == "ConfigMap" and component_of(o) == "flash").obj["data"]
    assert config["HEADSTART_FLASH_ENGINE_TARGET"] == "headstart-engine-serve:9000"
    assert config["HEADSTART_FLASH_HEALTH_PORT"] == "8090" and config["HEADSTART_FLASH_CLAIM_IDLE_MS"] == "60000"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_flash_settings_in_the_chart_exist_in_the_code():
    from services.flash.settings import FlashSettings

    config = next(o for o in render() if o.kind == "ConfigMap" and component_of(o) == "flash").obj["data"]
    fields = {"HEADSTART_FLASH_" + name.upper() for name in FlashSettings.model_fields}
    assert set(config) <= fields
    FlashSettings(**{k.removeprefix("HEADSTART_FLASH_").lower(): v for k, v in config.items()})


def _containers(objects):
    """(object, pod spec, container) of every pod template the chart renders (Deployments, Jobs, Ray pods)."""
    for o in objects:
        spec = o.obj.get("spec", {})
        templates = [spec.get("template")] if "template" in spec else []
        cluster = spec.get("rayClusterConfig")
        if cluster:
            templates += [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
        for template in filter(None, templates):
            for container in template["spec"]["containers"]:
                yield o, template["spec"], container


def test_engine_secret_is_a_file_never_an_environment_variable():
    """Issue 29: code of the engine's user could read a secret from any process's environment.
    Every pod that calls or answers the engine mounts the Secret as a file and names its path."""
    objects = render(("networkPolicy.enabled=true",))
    users = set()
    for o, pod, container in _containers(objects):
        for e in container.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef", {})
            assert ref.get("name") != "headstart-engine-secret", (o.name, e)
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        if "HEADSTART_ENGINE_SECRET_FILE" in env:
            users.add(component_of(o))
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert mounts["/etc/headstart/engine"] == "engine-secret"
            volume = next(v for v in pod["volumes"] if v["name"] == "engine-secret")
            assert volume["secret"]["secretName"] == "headstart-engine-secret" and volume["secret"]["defaultMode"] == 0o440
    assert users == {"engine", "gateway", "flash"}


@pytest.mark.parametrize("sets, mode", [((), "token"), (("engine.auth.rayToken=false",), None)])
def test_ray_cluster_runs_with_token_auth(sets, mode):
    ray = next(o for o in render(sets) if o.kind == "RayService")
    assert ray.obj["spec"]["rayClusterConfig"].get("authOptions", {}).get("mode") == mode


def test_ray_pods_start_workers_at_normal_priority():
    """Ray's raylet starts workers at niceness 15 unless told: the engine replicas (the serving
    work) would yield the CPU to every other process on their node (services/engine/ray_stack.py)."""
    ray = next(o for o in render() if o.kind == "RayService")
    config = ray.obj["spec"]["rayClusterConfig"]
    pods = [config["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in config["workerGroupSpecs"]]
    for pod in pods:
        for container in pod["containers"]:
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert env.get("RAY_worker_niceness") == "0", container["name"]


def test_the_charts_redis_never_evicts_and_syncs_before_it_acks():
    """Issue 45: data sessions' rows and seq counters live in the chart's Redis. It evicts nothing (a
    full store refuses a write, typed STORE_FULL, rather than dropping acknowledged rows) and fsyncs
    its append-only file before each reply (an ack survives a crash)."""
    (redis,) = [o for o in render() if component_of(o) == "redis" and o.kind == "StatefulSet"]
    ((_, container),) = containers(redis)
    args = container["args"]
    options = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
    assert options["--maxmemory-policy"] == "noeviction"
    assert (options["--appendonly"], options["--appendfsync"]) == ("yes", "always")
