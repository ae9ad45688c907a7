"""A custom resource checked as the API server checks it on create: against its upstream CRD's
``openAPIV3Schema`` and CEL rules. The CRDs are data in ``k8s/schemas/``."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from torchjob.k8s.validate.cel import rule_problems
from torchjob.k8s.validate.meta import effective_name

# Byte-for-byte copies of the upstream CRDs (k8s/schemas/SOURCES.md says where from); a test
# checks them against k8s/schemas/SHA256SUMS.
SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"
CRDS = {
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.v2.3.0.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"):
        "trainer.kubeflow.org_trainingruntimes.v2.3.0.yaml",
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"):
        "trainer.kubeflow.org_clustertrainingruntimes.v2.3.0.yaml",
}
INT_RANGES = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}
# metadata is an ObjectMeta; the CRD says only "type: object". Checked by the admission rules.
SchemaProblem = tuple[str, str]  # (field path, message)


@functools.lru_cache(maxsize=None)
def crd_schema(api_version: str, kind: str, schema_dir: Path = SCHEMA_DIR) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of the served version ``api_version`` of ``kind``."""
    path = schema_dir / CRDS[(api_version, kind)]
    crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    version = api_version.split("/")[1]
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            return dict(entry["schema"]["openAPIV3Schema"])
    raise KeyError(f"{path} has no version {version}")  # pragma: no cover - data error


def _type_of(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null" if value is None else type(value).__name__


def _join(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    text = str(key)
    if not re.fullmatch(r"[A-Za-z0-9_-]+", text):
        return f"{path}[{text!r}]"
    return f"{path}.{text}" if path else text


def check(value: Any, schema: dict[str, Any], path: str) -> Iterator[SchemaProblem]:
    """Every structural problem of ``value`` against ``schema``, with its field path: the
    structural-schema subset the CRDs use. Unknown fields are errors (kubectl's strict field
    validation); ``x-kubernetes-int-or-string`` is an integer or a string matching the field's
    ``pattern`` (a quantity such as ``500m``; an unquoted ``1.5`` is neither)."""
    if value is None:
        if not schema.get("nullable"):
            yield path, "is null; remove the field or give it a value"
        return
    if schema.get("x-kubernetes-int-or-string"):
        if _type_of(value) not in ("integer", "string"):
            yield path, (f"is {_type_of(value)} {value!r}, but an integer or a string is "
                         f"expected{' (quote it)' if _type_of(value) == 'number' else ''}")
        elif isinstance(value, str) and "pattern" in schema \
                and not re.search(schema["pattern"], value):
            yield path, f"{value!r} does not match {schema['pattern']}"
        yield from rule_problems(value, schema.get("x-kubernetes-validations", []), path)
        return
    if "anyOf" in schema and not any(not list(check(value, s, path)) for s in schema["anyOf"]):
        yield path, "matches none of the allowed forms"
        return
    want = schema.get("type")
    got = _type_of(value)
    if want and not (got == want or (want == "number" and got == "integer")):
        yield path, f"is {got}, but {want} is expected"
        return
    if "enum" in schema and value not in schema["enum"]:
        yield path, f"is {value!r}, not one of {schema['enum']}"
    if got == "integer" and schema.get("format") in INT_RANGES:
        low, high = INT_RANGES[schema["format"]]
        if not low <= value <= high:
            yield path, f"{value} does not fit {schema['format']}"
    if got in ("integer", "number"):
        if "minimum" in schema and value < schema["minimum"]:
            yield path, f"{value} is less than the minimum {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            yield path, f"{value} is more than the maximum {schema['maximum']}"
    if got == "string":
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            yield path, f"is longer than {schema['maxLength']} characters"
        if "minLength" in schema and len(value) < schema["minLength"]:
            yield path, f"is shorter than {schema['minLength']} characters"
        if "pattern" in schema and not re.search(schema["pattern"], value):
            yield path, f"{value!r} does not match {schema['pattern']}"
    if got == "array":
        yield from _check_array(value, schema, path)
    if got == "object":
        yield from _check_object(value, schema, path)
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            yield path, f"has more than {schema['maxProperties']} entries"
        if "minProperties" in schema and len(value) < schema["minProperties"]:
            yield path, f"has fewer than {schema['minProperties']} entries"
    yield from rule_problems(value, schema.get("x-kubernetes-validations", []), path)


def _check_array(value: list[Any], schema: dict[str, Any], path: str,
                 ) -> Iterator[SchemaProblem]:
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        yield path, f"has more than {schema['maxItems']} items"
    if "minItems" in schema and len(value) < schema["minItems"]:
        yield path, f"has fewer than {schema['minItems']} items"
    if "items" in schema:
        for i, item in enumerate(value):
            yield from check(item, schema["items"], _join(path, i))
    list_type = schema.get("x-kubernetes-list-type")
    keys = schema.get("x-kubernetes-list-map-keys", [])
    seen: dict[str, int] = {}
    for i, item in enumerate(value):
        if list_type == "set":
            ident = repr(item)
        elif list_type == "map" and isinstance(item, dict):
            ident = repr([item.get(k) for k in keys])
        else:
            continue
        if ident in seen:
            what = ", ".join(f"{k}={item.get(k)!r}" for k in keys) if list_type == "map" \
                else repr(item)
            yield _join(path, i), f"duplicates item {seen[ident]} ({what})"
        seen.setdefault(ident, i)


def _check_object(value: dict[Any, Any], schema: dict[str, Any],
                  path: str) -> Iterator[SchemaProblem]:
    props: dict[str, Any] = schema.get("properties", {})
    for key in schema.get("required", []):
        if key not in value:
            yield _join(path, key), "is required"
    extra = schema.get("additionalProperties")
    for key, item in value.items():
        where = _join(path, key)
        if not isinstance(key, str):
            yield where, "has a key that is not a string"
        elif key in props:
            yield from check(item, props[key], where)
        elif isinstance(extra, dict):
            yield from check(item, extra, where)
        elif extra is True or schema.get("x-kubernetes-preserve-unknown-fields"):
            continue
        elif props or extra is False:
            close = [p for p in props if p.lower() == key.lower()]
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            yield where, f"is not a field here{hint}; known fields: {', '.join(sorted(props))}"


def is_namespaced(api_version: str, kind: str, schema_dir: Path = SCHEMA_DIR) -> bool:
    path = schema_dir / CRDS[(api_version, kind)]
    return "\n  scope: Cluster\n" not in path.read_text()


def structural_problems(obj: dict[str, Any], schema_dir: Path = SCHEMA_DIR,
                        ) -> list[SchemaProblem]:
    """Problems of a custom resource of a vendored CRD against its schema and CEL rules ([]
    when it conforms). ``metadata`` is left to ``meta``, except what the root's rules read:
    ``name`` (the generated one for a ``generateName``) and ``generateName``."""
    key = (obj.get("apiVersion"), obj.get("kind"))
    if not all(isinstance(k, str) for k in key) or key not in CRDS:
        known = ", ".join(f"{k} {v}" for v, k in CRDS)
        return [("kind", f"{key[1]!r} of {key[0]!r} is not a kind checked here ({known})")]
    schema = crd_schema(str(key[0]), str(key[1]), schema_dir)
    body = {k: v for k, v in obj.items() if k != "metadata"}
    props = {k: v for k, v in schema["properties"].items() if k != "metadata"}
    root = {k: v for k, v in schema.items() if k != "x-kubernetes-validations"}
    problems = list(check(body, {**root, "properties": props}, "")) if body else []
    name = effective_name(obj.get("metadata"))
    if name is not None:  # without a name, meta reports it; the rules cannot run
        meta = {"name": name}
        generate = obj["metadata"].get("generateName")
        if isinstance(generate, str):
            meta["generateName"] = generate
        root_rules = rule_problems({**body, "metadata": meta},
                                   schema.get("x-kubernetes-validations", []), "")
        problems += [(path or "metadata.name" if "metadata.name" in message else path, message)
                     for path, message in root_rules]
    return problems
