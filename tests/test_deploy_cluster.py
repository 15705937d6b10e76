"""`headstart deploy status` and `smoke`: the real `kubernetes` client against a local HTTP
server that answers with stored API responses (tests/data/k8s_release_responses.json; no
cluster here), and the smoke check against a real gateway + Ray Serve engine."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

pytest.importorskip("kubernetes")

from services.deploy.cluster import (  # noqa: E402
    gateway_pod, job_of, release_selector, release_status, rollout_of, rayservice_of,
)
from services.deploy.smoke import SmokeError, run_smoke  # noqa: E402

DATA = json.loads((Path(__file__).parent / "data" / "k8s_release_responses.json").read_text())
NS, RELEASE = DATA["namespace"], DATA["release"]


class _Api(BaseHTTPRequestHandler):
    responses: dict = {}
    seen: list = []

    def do_GET(self):  # noqa: N802
        parts = urlsplit(self.path)
        self.seen.append((parts.path, parse_qs(parts.query)))
        body = self.responses.get(parts.path)
        status = 200 if body is not None else 404
        if body is None:
            body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                    "message": f"the server could not find the requested resource ({parts.path})"}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def api(request):
    """A kubernetes ApiClient talking to a loopback server with one scenario's responses."""
    from kubernetes import client

    handler = type("Api", (_Api,), {"responses": DATA["scenarios"][request.param], "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = client.Configuration()
    config.host = f"http://127.0.0.1:{server.server_address[1]}"
    api_client = client.ApiClient(config)
    api_client.seen = handler.seen
    yield api_client
    api_client.close()
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("api", ["rolling"], indirect=True)
def test_status_of_a_release_rolling_out(api):
    rows = {r.ref: r for r in release_status(api, NS, RELEASE)}
    assert {ref: r.ready for ref, r in rows.items()} == {
        "Deployment/hs-headstart-gateway": False,       # 1 of 2 ready
        "Deployment/hs-headstart-tablecache": False,    # generation 2 not yet observed
        "StatefulSet/hs-headstart-redis": True,
        "RayService/hs-headstart-engine": False,        # Ready=False, app DEPLOYING
        "Job/hs-headstart-tablecache-register": False,  # still retrying
    }
    assert rows["Deployment/hs-headstart-gateway"].detail == "1/2 ready, 2 updated"
    assert "spec not yet observed" in rows["Deployment/hs-headstart-tablecache"].detail
    assert "WaitForServeDeploymentReady" in rows["RayService/hs-headstart-engine"].detail
    assert "headstart-engine=DEPLOYING" in rows["RayService/hs-headstart-engine"].detail
    assert rows["Job/hs-headstart-tablecache-register"].component == "tablecache-register"
    # every list asked for the release's objects only
    selectors = {q["labelSelector"][0] for _, q in api.seen}
    assert selectors == {release_selector(RELEASE)}
    with pytest.raises(LookupError, match="no ready gateway pod"):
        gateway_pod(api, NS, RELEASE)


@pytest.mark.parametrize("api", ["ready"], indirect=True)
def test_status_of_a_ready_release(api):
    rows = release_status(api, NS, RELEASE)
    assert len(rows) == 5 and all(r.ready for r in rows), [(r.ref, r.detail) for r in rows]
    engine = next(r for r in rows if r.ref.startswith("RayService/"))
    assert engine.component == "engine" and "3 serve endpoint(s)" in engine.detail
    assert gateway_pod(api, NS, RELEASE) == "hs-headstart-gateway-5d9c-fghij"  # the ready one


@pytest.mark.parametrize("api", ["ready"], indirect=True)
def test_status_without_kuberay_says_so(api):
    del api.seen[:]
    # a cluster without the CRD answers 404 for ray.io/v1
    responses = DATA["scenarios"]["ready"]
    path = f"/apis/ray.io/v1/namespaces/{NS}/rayservices"
    saved = responses.pop(path)
    try:
        rows = {r.ref: r for r in release_status(api, NS, RELEASE)}
    finally:
        responses[path] = saved
    assert not rows["RayService/*"].ready and "KubeRay" in rows["RayService/*"].detail


def test_stored_rayservices_match_the_crd_schema():
    """The stored RayService responses have the shape KubeRay's CRD declares (status included)."""
    from services.deploy.validate import CRD_SCHEMAS, crd_validator

    validator = crd_validator(CRD_SCHEMAS[("ray.io/v1", "RayService")])
    for scenario in DATA["scenarios"].values():
        for item in scenario[f"/apis/ray.io/v1/namespaces/{NS}/rayservices"]["items"]:
            assert [e.message for e in validator.iter_errors(item)] == []


@pytest.mark.parametrize("obj, ready", [
    ({"metadata": {"generation": 4}, "spec": {"replicas": 3},
      "status": {"observedGeneration": 4, "readyReplicas": 3, "updatedReplicas": 3}}, True),
    ({"metadata": {"generation": 4}, "spec": {"replicas": 3},
      "status": {"observedGeneration": 4, "readyReplicas": 3, "updatedReplicas": 2}}, False),
    ({"metadata": {"generation": 1}, "spec": {"replicas": 1}, "status": {}}, False),
    ({"metadata": {"generation": 1}, "spec": {"replicas": 0}, "status": {"observedGeneration": 1}}, True),
])
def test_rollout_verdicts(obj, ready):
    assert rollout_of("Deployment", obj).ready is ready


@pytest.mark.parametrize("status, ready", [
    ({"serviceStatus": "Running"}, True),  # KubeRay before Ready conditions
    ({"serviceStatus": "WaitForServeDeploymentReady"}, False),
    ({"conditions": [{"type": "Ready", "status": "True"}],
      "activeServiceStatus": {"applicationStatuses": {"a": {"status": "UNHEALTHY"}}}}, False),
    ({}, False),
])
def test_rayservice_verdicts(status, ready):
    assert rayservice_of({"metadata": {"name": "x"}, "status": status}).ready is ready


def test_job_verdicts():
    assert job_of({"metadata": {"name": "j"}, "status": {"succeeded": 1, "failed": 3}}).ready
    assert not job_of({"metadata": {"name": "j"}, "status": {"failed": 6}}).ready


@pytest.mark.slow
def test_smoke_types_a_question_through_a_real_gateway(serve_stack):
    # random weights: no real SQL, but the typed session must answer with a TTFT
    result = run_smoke(serve_stack.grpc_target, token="tok-alice", db="concert_singer",
                       question="How many singers do we have?", max_new_tokens=8, require_sql=False, pause_s=0.01)
    assert result.ttft_ms > 0 and result.prompt_tokens > 0 and result.wall_ms >= result.ttft_ms
    with pytest.raises(SmokeError, match="not SQL"):
        run_smoke(serve_stack.grpc_target, token="tok-alice", db="concert_singer", question="How many singers?",
                  max_new_tokens=4, require_sql=True, pause_s=0.0)
    with pytest.raises(SmokeError, match="UNAUTHENTICATED"):
        run_smoke(serve_stack.grpc_target, token="wrong-token", question="How many singers?", pause_s=0.0)
