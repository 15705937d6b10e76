"""What the rendered objects promise, checked by parsing them: secrets only in Secrets,
NetworkPolicies that select rendered pods with the gateway as the only way in, probes on
declared ports, requests and non-root security contexts on every container."""

from __future__ import annotations

import base64

import pytest

from tests.deploy_helpers import ALL_ON, component_of, containers, matches, pod_templates, render

# Secrets given as values: none of these strings may appear outside a Secret.
TOKEN = "tok-acme-0123456789abcdef"
REDIS_PASSWORD = "redis-pw-7f3a9c1e5b"
PG_DSN = "postgresql://reader:pg-pw-41d8cd98f0@db.example:5432/sales"
CATALOGUE_DSN = "postgresql://reader:cat-pw-8277e0910d@db.example:5432/sales"
EXTERNAL_URL = "rediss://:ext-pw-9e107d9d37@redis.example:6380/0"
WITH_SECRETS = ALL_ON + (
    f"gateway.auth.tokens.acme={TOKEN}",
    f"redis.auth.password={REDIS_PASSWORD}",
    f"tablecache.databases={{{PG_DSN}}}",
    f"catalogue.postgres.dsns.sales={CATALOGUE_DSN}",
)
RENDERS = {
    "defaults": (),
    "all-on with secrets": WITH_SECRETS,
    "external redis": (f"redis.enabled=false", f"redis.external.url={EXTERNAL_URL}"),
    "gateway off": ("gateway.enabled=false",),
    "engine off": ("engine.enabled=false",),
    "tablecache off": ("tablecache.enabled=false",),
    "gateway restricted": ("networkPolicy.gatewayFrom[0].ipBlock.cidr=10.0.0.0/8",),
}


@pytest.fixture(params=list(RENDERS), scope="module")
def objects(request):
    return render(RENDERS[request.param])


def _dump(obj) -> str:
    import yaml

    return yaml.safe_dump(obj.obj)


@pytest.mark.parametrize("sets, secret", [
    (WITH_SECRETS, TOKEN), (WITH_SECRETS, REDIS_PASSWORD), (WITH_SECRETS, PG_DSN), (WITH_SECRETS, "pg-pw-41d8cd98f0"),
    (WITH_SECRETS, CATALOGUE_DSN), (WITH_SECRETS, "cat-pw-8277e0910d"),
    (RENDERS["external redis"], EXTERNAL_URL), (RENDERS["external redis"], "ext-pw-9e107d9d37"),
])
def test_secret_values_appear_only_in_secrets(sets, secret):
    objects = render(sets)
    outside = [o.ref for o in objects if o.kind != "Secret" and secret in _dump(o)]
    assert outside == []
    # ...and they are in a Secret (base64 in `data`)
    decoded = [base64.b64decode(v).decode() for o in objects if o.kind == "Secret"
               for v in o.obj.get("data", {}).values()]
    assert any(secret in d for d in decoded)


def test_generated_secrets_stay_out_of_configmaps_and_env_literals(objects):
    secrets = {base64.b64decode(v).decode() for o in objects if o.kind == "Secret"
               for v in o.obj.get("data", {}).values()}
    secrets |= {v for s in list(secrets) for v in _json_values(s)}
    secrets = {s for s in secrets if len(s) >= 8}
    assert secrets  # tokens and the Redis password are always generated or given
    for obj in objects:
        if obj.kind == "ConfigMap":
            assert not [k for k, v in obj.obj.get("data", {}).items() if any(s in v for s in secrets)], obj.ref
        for _, container in containers(obj):
            for env in container.get("env", []):
                literal = env.get("value", "")
                assert not any(s in literal for s in secrets), f"{obj.ref} {container['name']} {env['name']}"
                if env["name"].endswith("_FILE"):  # a path to a mounted Secret (the engine secret)
                    continue
                if any(word in env["name"] for word in ("TOKEN", "PASSWORD", "STORE_URL", "REDIS_URL", "SECRET")):
                    assert "secretKeyRef" in env.get("valueFrom", {}), f"{obj.ref} {env['name']} is not from a Secret"


def _json_values(text: str) -> list[str]:
    import json

    try:
        data = json.loads(text)
    except ValueError:
        return []
    if isinstance(data, dict):
        return [str(k) for k in data] + [str(v) for v in data.values()]
    return [str(v) for v in data] if isinstance(data, list) else []


def _pods(objects) -> list[tuple[str, dict]]:
    return [(o.ref, t["metadata"]["labels"]) for o in objects for t in pod_templates(o)]


def test_every_network_policy_selects_rendered_pods_and_only_the_gateway_is_open(objects):
    policies = [o for o in objects if o.kind == "NetworkPolicy"]
    if not policies:
        pytest.skip("NetworkPolicies off")
    pods = _pods(objects)
    covered = set()
    for policy in policies:
        spec = policy.obj["spec"]
        selected = [ref for ref, labels in pods if matches(spec["podSelector"], labels)]
        assert selected, f"{policy.ref} selects no rendered pod"
        covered |= set(selected)
        assert spec["policyTypes"] == ["Ingress"]
        is_gateway = component_of(policy) == "gateway"
        for rule in spec.get("ingress", []):
            peers = rule.get("from")
            if not peers:  # open to anyone
                assert is_gateway, f"{policy.ref} takes ingress from anywhere"
                continue
            for peer in peers:
                if "namespaceSelector" in peer or "ipBlock" in peer:
                    assert is_gateway or _is_kuberay_operator(peer, rule) or _is_prometheus_on_ray_metrics(
                        policy, peer, rule), f"{policy.ref}: {peer}"
                else:
                    assert [r for r, labels in pods if matches(peer["podSelector"], labels)], \
                        f"{policy.ref}: peer {peer} matches no rendered pod"
    # default deny: every pod the chart makes is behind some policy
    assert covered == {ref for ref, _ in pods}


def _is_prometheus_on_ray_metrics(policy, peer: dict, rule: dict) -> bool:
    """The engine admits the monitoring namespace (pods of no particular kind) on Ray's metrics port only."""
    return (component_of(policy) == "engine" and "podSelector" not in peer and "namespaceSelector" in peer
            and [p["port"] for p in rule.get("ports", [])] == [8080])


def _is_kuberay_operator(peer: dict, rule: dict) -> bool:
    """The one outside peer a non-gateway pod admits: the KubeRay operator's pods, on Ray's
    dashboard / agent / Serve health ports only."""
    return (peer.get("podSelector", {}).get("matchLabels") == {"app.kubernetes.io/name": "kuberay-operator"}
            and "namespaceSelector" in peer
            and {p["port"] for p in rule.get("ports", [])} == {8265, 52365, 8000})


def test_users_reach_what_they_need(objects):
    """The policies admit the chart's own traffic: gateway and flash worker -> engine gRPC,
    gateway (data API), engine, table cache and flash worker -> Redis, the registration Job
    -> table cache."""
    policies = {component_of(o): o.obj["spec"] for o in objects if o.kind == "NetworkPolicy"}
    if not policies:
        pytest.skip("NetworkPolicies off")
    labels = {component_of(o): t["metadata"]["labels"] for o in objects for t in pod_templates(o)}

    def admits(target: str, source: str) -> bool:
        return any(matches(peer.get("podSelector", {}), labels[source])
                   for rule in policies[target].get("ingress", []) for peer in rule.get("from", [])
                   if "namespaceSelector" not in peer and "podSelector" in peer)

    pairs = [("engine", "gateway"), ("redis", "engine"), ("redis", "tablecache"), ("tablecache", "tablecache-register"),
             ("engine", "flash"), ("redis", "flash"), ("redis", "gateway")]
    for target, source in pairs:
        if target in policies and source in labels:
            assert admits(target, source), f"{source} cannot reach {target}"
    for target, source in [("tablecache", "gateway"), ("engine", "redis"), ("flash", "gateway"),
                           ("tablecache", "flash")]:
        if target in policies and source in labels:
            assert not admits(target, source), f"{source} should not reach {target}"


def test_every_probe_points_at_a_declared_port(objects):
    for obj in objects:
        for _, container in containers(obj):
            names = {p.get("name") for p in container.get("ports", [])}
            numbers = {p["containerPort"] for p in container.get("ports", [])}
            for probe_name in ("readinessProbe", "livenessProbe", "startupProbe"):
                probe = container.get(probe_name)
                if not probe:
                    continue
                handler = probe.get("httpGet") or probe.get("tcpSocket") or probe.get("grpc")
                assert handler, f"{obj.ref} {probe_name} has no port handler"
                port = handler["port"]
                assert port in (names if isinstance(port, str) else numbers), \
                    f"{obj.ref} {container['name']} {probe_name} -> {port}, declared {names | numbers}"


def test_services_target_declared_ports_of_pods_they_select(objects):
    pods = [(t["metadata"]["labels"], c) for o in objects for t in pod_templates(o)
            for c in t["spec"]["containers"]]
    for svc in (o for o in objects if o.kind == "Service"):
        selected = [c for labels, c in pods if matches({"matchLabels": svc.obj["spec"]["selector"]}, labels)]
        assert selected, f"{svc.ref} selects no pod"
        declared = {p.get("name") for c in selected for p in c.get("ports", [])}
        for port in svc.obj["spec"]["ports"]:
            assert port["targetPort"] in declared, f"{svc.ref} -> {port['targetPort']}"


def test_gateway_has_http_and_grpc_health_probes():
    gateway = next(o for o in render() if o.kind == "Deployment" and component_of(o) == "gateway")
    (_, container), = containers(gateway)
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["livenessProbe"]["grpc"]["port"] == 50051


def test_every_container_has_requests_and_a_non_root_security_context(objects):
    for obj in objects:
        for pod_spec, container in containers(obj):
            who = f"{obj.ref} {container['name']}"
            requests = container.get("resources", {}).get("requests", {})
            assert {"cpu", "memory"} <= set(requests), f"{who} lacks cpu/memory requests"
            assert container.get("resources", {}).get("limits", {}).get("memory"), f"{who} lacks a memory limit"
            ctx, pod_ctx = container.get("securityContext", {}), pod_spec.get("securityContext", {})
            assert ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")) is True, who
            assert (ctx.get("runAsUser") or pod_ctx.get("runAsUser") or 0) > 0, who
            assert ctx.get("allowPrivilegeEscalation") is False, who
            assert "ALL" in ctx.get("capabilities", {}).get("drop", []), who
            assert pod_ctx.get("seccompProfile", {}).get("type") == "RuntimeDefault", who
            assert pod_spec.get("automountServiceAccountToken") is False, who
            # a writable root only where Ray needs one
            if not container["name"].startswith("ray-"):
                assert ctx.get("readOnlyRootFilesystem") is True, who


def test_gpu_requests_follow_gpus_per_replica():
    objects = render(("engine.gpusPerReplica=2", "engine.device=cuda", "tablecache.gpus=1"))
    service = next(o for o in objects if o.kind == "RayService")
    worker = service.obj["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert worker["resources"]["requests"]["nvidia.com/gpu"] == 2
    head = service.obj["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in head["resources"].get("limits", {})
    cache = next(o for o in objects if o.kind == "Deployment" and component_of(o) == "tablecache")
    assert cache.obj["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1


def _pod_specs(obj) -> list[dict]:
    """The pod specs of a Deployment or of a RayService's head and worker groups."""
    spec = obj.obj["spec"]
    if "rayClusterConfig" in spec:
        cluster = spec["rayClusterConfig"]
        return [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"]
                                                                for g in cluster["workerGroupSpecs"]]
    return [spec["template"]["spec"]]


@pytest.mark.parametrize("sets, name", [((), "headstart-engine-secret"),
                                        (("engine.auth.existingSecret=my-engine-secret",), "my-engine-secret")])
def test_gateway_and_every_ray_pod_read_one_engine_secret(sets, name):
    """The gateway sends the engine secret (services/engine/guard.py) that every replica checks:
    both read it from the same Secret key, mounted as a file (issue 29: not in an environment),
    never from a literal; a generated one is rendered."""
    objects = render(sets)
    pods = [p for o in objects if (o.kind == "Deployment" and component_of(o) == "gateway") or o.kind == "RayService"
            for p in _pod_specs(o)]
    assert len(pods) >= 3  # the gateway, the Ray head, the Ray workers
    refs = []
    for pod in pods:
        (container,) = pod["containers"]
        assert {"name": "HEADSTART_ENGINE_SECRET_FILE", "value": "/etc/headstart/engine/secret"} in container["env"]
        assert {"name": "engine-secret", "mountPath": "/etc/headstart/engine", "readOnly": True} \
            in container["volumeMounts"]
        refs.append(next(v["secret"] for v in pod["volumes"] if v["name"] == "engine-secret"))
    assert all(r["items"] == [{"key": "secret", "path": "secret"}] for r in refs), refs
    assert {r["secretName"] for r in refs} == {name}
    rendered = [o for o in objects if o.kind == "Secret" and o.obj["metadata"]["name"] == name]
    assert len(rendered) == (0 if "existingSecret" in " ".join(sets) else 1)
    if rendered:
        assert len(base64.b64decode(rendered[0].obj["data"]["secret"])) >= 32


@pytest.mark.parametrize("sets, direct", [((), True), (("engine.autoscaling.enabled=true",), False),
                                          (("engine.direct.enabled=false",), False)])
def test_direct_session_ports_are_declared_admitted_and_named_to_the_gateway(sets, direct):
    """The replicas' direct ingress (services/engine/direct.py): every Ray pod binds the range on
    all interfaces and advertises its pod IP, declares the ports, admits the gateway on them
    (and only the gateway), and the gateway is told to use them; off while Serve autoscales."""
    objects = render(sets + ("engine.direct.port=9200", "engine.direct.portsPerPod=3"))
    engine = next(o for o in objects if o.kind == "RayService")
    for _, container in containers(engine):
        env = {e["name"]: e for e in container.get("env", [])}
        assert env["HEADSTART_ENGINE_DIRECT"]["value"] == ("on" if direct else "off")
        assert env["HEADSTART_ENGINE_DIRECT_HOST"]["value"] == "0.0.0.0"
        assert env["HEADSTART_ENGINE_DIRECT_PORTS"]["value"] == "9200-9202"
        assert env["HEADSTART_ENGINE_DIRECT_ADVERTISE"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        ports = {p["containerPort"] for p in container["ports"]}
        assert ({9200, 9201, 9202} <= ports) == direct and not ports & {9203}
    gateway_config = next(o for o in objects if o.kind == "ConfigMap" and component_of(o) == "gateway")
    assert gateway_config.obj["data"]["HEADSTART_GATEWAY_ENGINE_DIRECT"] == ("true" if direct else "false")
    policy = next(o for o in objects if o.kind == "NetworkPolicy" and component_of(o) == "engine").obj["spec"]
    ranges = [(rule["from"], p) for rule in policy["ingress"] for p in rule.get("ports", []) if p["port"] == 9200]
    assert len(ranges) == (1 if direct else 0)
    if direct:
        peers, port = ranges[0]
        assert port["endPort"] == 9202 and port["protocol"] == "TCP"
        assert [component_of_labels(p["podSelector"]["matchLabels"]) for p in peers] == ["gateway"]


def component_of_labels(labels: dict) -> str:
    return labels["app.kubernetes.io/component"]
