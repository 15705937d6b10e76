"""Extract one version's OpenAPI schema from a CustomResourceDefinition YAML into
services/deploy/schemas/ (the data `headstart deploy validate` checks custom resources with).

    python scripts/vendor_crd_schema.py ray.io_rayservices.yaml --version v1 \
        --out services/deploy/schemas/ray.io_v1_rayservice.json --source "ray-project/kuberay v1.7.0"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml


def extract(crd: dict, version: str) -> dict:
    """The openAPIV3Schema of `version` of a CRD, with group/kind recorded beside it."""
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            return {
                "group": crd["spec"]["group"], "version": version, "kind": crd["spec"]["names"]["kind"],
                "schema": entry["schema"]["openAPIV3Schema"],
            }
    raise SystemExit(f"version {version} not in {[v['name'] for v in crd['spec']['versions']]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("crd", type=Path)
    parser.add_argument("--version", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--source", required=True, help="where the CRD came from (kept in the file)")
    ns = parser.parse_args()
    data = extract(yaml.safe_load(ns.crd.read_text()), ns.version)
    data = {"source": ns.source, "license": "Apache-2.0 (see the LICENSE-* file of its project beside this file)", **data}
    ns.out.write_text(json.dumps(data, separators=(",", ":"), sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
