"""`headstart deploy` as a user runs it: render prints the manifests or exits 2 naming the
bad key, validate says the manifests are valid, status without a cluster says so."""

from __future__ import annotations

import pytest
import yaml

pytest.importorskip("helm_python")

from typer.testing import CliRunner  # noqa: E402

from cli.app import app  # noqa: E402
from tests.deploy_helpers import IMAGE, render  # noqa: E402

runner = CliRunner()


def test_render_prints_every_object():
    result = runner.invoke(app, ["deploy", "render", "--set", IMAGE, "--set", "gateway.replicas=3"])
    assert result.exit_code == 0, result.output
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == \
        [(o.kind, o.name) for o in render(("gateway.replicas=3",))]
    assert "# Source: headstart/templates/engine-rayservice.yaml" in result.stdout


@pytest.mark.parametrize("args, words", [
    (["--set", "gateway.replcas=3"], "replcas"),
    (["--set", "redis.port=sixty"], "/redis/port"),
    (["--set", "novalue"], "KEY=VALUE"),
])
def test_render_exits_2_naming_the_bad_key(args, words):
    result = runner.invoke(app, ["deploy", "render", *args])
    assert result.exit_code == 2 and words in result.output


def test_render_of_a_missing_values_file_fails(tmp_path):
    result = runner.invoke(app, ["deploy", "render", "-f", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and "nope.yaml" in result.output


def test_render_without_the_image_says_how_to_build_and_name_it():
    result = runner.invoke(app, ["deploy", "render"])
    assert result.exit_code == 2 and "image.repository is required" in result.output
    assert "docker build --build-context shared=../shared" in result.output


def test_validate_passes_the_defaults():
    result = runner.invoke(app, ["deploy", "validate", "--set", IMAGE])
    assert result.exit_code == 0, result.output
    assert "valid for Kubernetes 1.33.0 (strict); helm lint clean" in result.output


def test_status_without_a_cluster_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    result = runner.invoke(app, ["deploy", "status"])
    assert result.exit_code == 2 and "no kubeconfig" in result.output
