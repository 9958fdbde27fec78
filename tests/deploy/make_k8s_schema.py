"""Regenerate `k8s_schema.json`: the strict JSON schemas of the Kubernetes kinds that
`k8s/` uses, cut out of the `kubernetes-validate` wheel (schemas generated from
the Kubernetes OpenAPI spec, Apache-2.0), so the tests validate offline with
`jsonschema` alone. Descriptions and `status` are dropped; only definitions
reachable from those kinds are kept.

    python3 -m venv /tmp/kv && /tmp/kv/bin/pip install kubernetes-validate==1.37.0
    /tmp/kv/bin/python tests/deploy/make_k8s_schema.py 1.33.0

Add a kind to KINDS when a manifest starts using it.
"""

from __future__ import annotations

import json
import re
import sys
from importlib import resources
from pathlib import Path
from typing import Any

KINDS = {  # (apiVersion, kind) -> schema file of kubernetes-validate
    ("v1", "Namespace"): "namespace-v1.json",
    ("v1", "ConfigMap"): "configmap-v1.json",
    ("v1", "Service"): "service-v1.json",
    ("apps/v1", "Deployment"): "deployment-apps-v1.json",
    ("apps/v1", "DaemonSet"): "daemonset-apps-v1.json",
}
REF = re.compile(r"^(?:/api/_definitions\.json)?#/\$defs/(.+)$")
OUT = Path(__file__).with_name("k8s_schema.json")


def _clean(node: Any, refs: set[str]) -> Any:
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "description" and isinstance(value, str):
                continue
            if key == "$ref":
                name = REF.match(value).group(1)  # type: ignore[union-attr]
                refs.add(name)
                out[key] = f"#/$defs/{name}"
                continue
            out[key] = _clean(value, refs)
        return out
    if isinstance(node, list):
        return [_clean(v, refs) for v in node]
    return node


def main(version: str) -> None:
    root = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    folder = root / f"v{version}-local-strict"
    all_defs = json.loads((folder / "_definitions.json").read_text())["$defs"]
    kinds: dict[str, Any] = {}
    pending: set[str] = set()
    for (api, kind), fname in KINDS.items():
        schema = json.loads((folder / fname).read_text())
        schema["properties"].pop("status", None)
        kinds[f"{api}/{kind}"] = _clean(schema, pending)
    defs: dict[str, Any] = {}
    while pending:
        name = pending.pop()
        if name not in defs:
            found: set[str] = set()
            defs[name] = _clean(all_defs[name], found)
            pending |= found - defs.keys()
    doc = {"kubernetes": version, "kinds": kinds, "$defs": dict(sorted(defs.items()))}
    OUT.write_text(json.dumps(doc, separators=(",", ":"), sort_keys=True) + "\n")
    print(f"{OUT}: {len(kinds)} kinds, {len(defs)} definitions, {OUT.stat().st_size} bytes")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "1.33.0")
