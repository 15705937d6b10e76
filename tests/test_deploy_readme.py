"""The chart's values are documented: a `# --` comment on every key of values.yaml, the
generated table in the chart README is current, and values.yaml and values.schema.json
name the same keys (the schema allows nothing undocumented)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "headstart"


def _gen():
    spec = importlib.util.spec_from_file_location("gen_chart_readme", ROOT / "scripts" / "gen_chart_readme.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_readme_values_table_is_current():
    gen = _gen()
    readme = (CHART / "README.md").read_text()
    assert gen.render_readme(readme, (CHART / "values.yaml").read_text()) == readme, \
        "run: .venv/bin/python scripts/gen_chart_readme.py"


def test_every_key_has_a_doc_comment():
    gen = _gen()
    rows = gen.rows((CHART / "values.yaml").read_text())  # raises on an undocumented key
    assert len(rows) > 80 and all(doc for *_, doc in rows)


def test_an_undocumented_key_is_an_error():
    gen = _gen()
    with pytest.raises(gen.ValuesDocError, match="gateway.extra"):
        gen.rows("# -- the gateway\ngateway:\n  # -- on\n  enabled: true\n  extra: 1\n")


def _schema_paths(node: dict, defs: dict, path: tuple = ()) -> set[tuple[str, ...]]:
    out = set()
    for name, sub in node.get("properties", {}).items():
        out.add(path + (name,))
        if "$ref" in sub:
            sub = defs[sub["$ref"].rsplit("/", 1)[-1]]
        out |= _schema_paths(sub, defs, path + (name,))
    return out


def test_values_and_schema_name_the_same_keys():
    gen = _gen()
    schema = json.loads((CHART / "values.schema.json").read_text())
    in_schema = _schema_paths(schema, schema["$defs"])
    in_values = {k.path for k in gen.key_lines((CHART / "values.yaml").read_text())}
    # values.yaml keys under free-form maps (resources, label maps) are not schema properties
    free = {p for p in in_values if any(part in ("resources", "kuberayOperatorNamespace") for part in p[:-1])}
    assert in_values - free - in_schema == set()
    # optional keys the schema allows without a default in values.yaml
    optional = {("podSecurityContext", "seccompProfile", "localhostProfile"), ("containerSecurityContext", "capabilities", "add")}
    assert in_schema - in_values - optional == set()


# Kubernetes' own structures, which the rendered manifests' validation checks.
OPEN_BY_DESIGN = {"/properties/gateway/properties/affinity", "/$defs/tolerations/items",
                  "/properties/networkPolicy/properties/gatewayFrom/items"}


def test_every_schema_object_is_closed():
    """additionalProperties is false, or a typed schema for free-form maps, at every level."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    checked = []

    def walk(node, path):
        if isinstance(node, dict):
            if path.startswith("/allOf"):  # conditions on values, not objects
                return
            if (node.get("type") == "object" or "properties" in node) and path not in OPEN_BY_DESIGN:
                assert node.get("additionalProperties", True) is not True, f"{path} is open"
                checked.append(path)
            for key, value in node.items():
                walk(value, f"{path}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")

    walk(schema, "")
    assert len(checked) > 30
