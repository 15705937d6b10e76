"""Render and lint the headstart Helm chart in-process (helm-python-sdk, Helm v4's Go SDK
bound through ctypes: no helm binary).

`render_chart(values_files, sets)` composes values as `helm template -f ... --set ...`
does (files in order, then each --set), validates them against the chart's
values.schema.json and returns the rendered objects. A misspelled or mistyped
key raises `ChartValuesError`, whose message names the key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from headstart.paths import REPO_ROOT

CHART_DIR = REPO_ROOT / "deploy" / "helm" / "headstart"
DEFAULT_RELEASE = "headstart"
DEFAULT_NAMESPACE = "default"


class ChartError(RuntimeError):
    """The chart cannot be loaded or rendered."""


class ChartValuesError(ChartError, ValueError):
    """Values the chart's schema rejects (the message names the key)."""


@dataclass(frozen=True)
class RenderedObject:
    """One Kubernetes object of a rendered chart."""

    template: str  # e.g. headstart/templates/gateway-deployment.yaml
    obj: dict[str, Any]

    @property
    def kind(self) -> str:
        return self.obj.get("kind", "")

    @property
    def name(self) -> str:
        return self.obj.get("metadata", {}).get("name", "")

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.name}"


def _helm():
    try:
        import helm_python
    except ImportError as exc:  # the `deploy` extra is missing
        raise ChartError("helm-python-sdk is not installed: pip install 'headstart[deploy]'") from exc
    return helm_python


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` into a copy of `base`, maps merged key by key (Helm's coalescing of user values)."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def compose_values(values_files: Sequence[str | Path] = (), sets: Sequence[str] = ()) -> dict[str, Any]:
    """User values from `-f` files (in order) and `--set KEY=VALUE` strings (Helm's parser).

    Raises:
        ChartValuesError: a file that is not a YAML map, or a malformed --set.
    """
    values: dict[str, Any] = {}
    for path in values_files:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ChartValuesError(f"values file {path}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ChartValuesError(f"values file {path}: expected a map at the top level")
        values = deep_merge(values, loaded)
    helm = _helm()
    for expression in sets:
        if "=" not in expression:
            raise ChartValuesError(f"--set {expression!r}: expected KEY=VALUE")
        try:
            values = deep_merge(values, helm.parse_set_string(expression))
        except helm.HelmError as exc:
            raise ChartValuesError(f"--set {expression!r}: {exc}") from exc
    return values


def render_manifests(values: dict[str, Any] | None = None, *, release: str = DEFAULT_RELEASE,
                     namespace: str = DEFAULT_NAMESPACE, chart_dir: Path = CHART_DIR) -> dict[str, str]:
    """Template path -> rendered text (NOTES.txt included), as `helm template` renders them.

    Raises:
        ChartValuesError: the values break the chart's schema.
        ChartError: the chart does not load or a template fails.
    """
    helm = _helm()
    try:
        with helm.Chart.load(str(chart_dir)) as chart:
            return chart.render(values or {}, name=release, namespace=namespace, is_install=True)
    except helm.HelmValuesError as exc:
        raise ChartValuesError(str(exc).strip()) from exc
    except helm.HelmError as exc:
        raise ChartError(f"{type(exc).__name__}: {str(exc).strip()}") from exc


def parse_manifests(manifests: dict[str, str]) -> list[RenderedObject]:
    """The objects of rendered templates, in template order (NOTES.txt and empty documents left out)."""
    objects = []
    for template in sorted(manifests):
        if template.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(manifests[template]):
            if doc:
                objects.append(RenderedObject(template, doc))
    return objects


def render_chart(values_files: Sequence[str | Path] = (), sets: Sequence[str] = (), *,
                 release: str = DEFAULT_RELEASE, namespace: str = DEFAULT_NAMESPACE,
                 chart_dir: Path = CHART_DIR) -> list[RenderedObject]:
    """Compose values, render, parse: what `headstart deploy render` prints."""
    values = compose_values(values_files, sets)
    return parse_manifests(render_manifests(values, release=release, namespace=namespace, chart_dir=chart_dir))


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (a RayService's serveConfigV2) as readable `|` blocks."""


def _str(dumper: yaml.SafeDumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def to_yaml(objects: Sequence[RenderedObject]) -> str:
    """A multi-document YAML stream, each object preceded by its template (as `helm template`)."""
    parts = [f"---\n# Source: {o.template}\n" + yaml.dump(o.obj, Dumper=_BlockDumper, sort_keys=False)
             for o in objects]
    return "".join(parts)


def lint_chart(values: dict[str, Any] | None = None, *, kube_version: str | None = None,
               chart_dir: Path = CHART_DIR) -> list[str]:
    """`helm lint --strict`: the findings of warning level or worse ("SEVERITY path: message")."""
    report = _helm().lint(str(chart_dir), values or {}, strict=True, kube_version=kube_version)
    names = {0: "UNKNOWN", 1: "INFO", 2: "WARNING", 3: "ERROR"}
    findings = [f"{names.get(m['severity'], m['severity'])} {m['path']}: {m['error']}"
                for m in report.get("messages", []) if m.get("severity", 0) >= 2]
    return findings + [f"ERROR {e}" for e in report.get("errors", []) or []]
