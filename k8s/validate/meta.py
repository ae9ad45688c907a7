"""``metadata`` as the API server validates it on create (k8s.io/apimachinery
pkg/api/validation/objectmeta.go): name or generateName, namespace, labels, annotations."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from torchjob.jobs.values import (DNS_1035, DNS_1123_LABEL, DNS_LABEL_MAX, QUALIFIED_NAME,
                                  qualified_name_problem, subdomain_problem)

MetaProblem = tuple[str, str]  # (field path, message)
LABEL_VALUE = re.compile(rf"({QUALIFIED_NAME.pattern})?")
# On create the API server first sets ``name`` to ``generateName`` cut to 58 characters plus 5
# random ones from "bcdfghjklmnpqrstvwxz2456789" (k8s.io/apiserver pkg/storage/names), then
# validates: a long generateName is cut, not refused.
MAX_GENERATED_PREFIX = 58  # names.MaxGeneratedNameLength = 63 - 5
GENERATED = "bcdfg"  # stands for the 5 random characters
MAX_ANNOTATIONS = 256 * 1024  # TotalAnnotationSizeLimitB
# ObjectMeta's fields (k8s.io/apimachinery pkg/apis/meta/v1 types.go); strict field
# validation refuses any other key under metadata.
OBJECT_META = {"name", "generateName", "namespace", "selfLink", "uid", "resourceVersion",
               "generation", "creationTimestamp", "deletionTimestamp",
               "deletionGracePeriodSeconds", "labels", "annotations", "ownerReferences",
               "finalizers", "managedFields"}


def effective_name(meta: object) -> str | None:
    """The name the object will have once created: ``name``, or ``generateName`` cut to 58
    characters plus the generated suffix; None when neither is a string."""
    if not isinstance(meta, dict):
        return None
    name, prefix = meta.get("name"), meta.get("generateName")
    if isinstance(name, str) and name:
        return name
    if isinstance(prefix, str) and prefix:
        return prefix[:MAX_GENERATED_PREFIX] + GENERATED
    return None


def dns_1035_problem(name: object) -> str | None:
    """Why ``name`` is not a DNS-1035 label (a Service's or a PyTorchJob's name); None when it
    is."""
    if isinstance(name, str) and len(name) <= DNS_LABEL_MAX and DNS_1035.fullmatch(name):
        return None
    return (f"{name!r} is not a DNS-1035 label (lower case letters, digits and '-', starting "
            f"with a letter, at most {DNS_LABEL_MAX} characters)")


def label_value_problem(value: object) -> str | None:
    """Why ``value`` is not a label value (a string of at most 63 characters)."""
    if not isinstance(value, str):
        return (f"is {type(value).__name__} {value!r}: label values are strings; quote it "
                f"('{value}')")
    if len(value) > DNS_LABEL_MAX:
        return f"must be no more than {DNS_LABEL_MAX} characters"
    if not LABEL_VALUE.fullmatch(value):
        return ("must be empty or letters, digits, '-', '_' or '.', starting and ending with a "
                "letter or digit")
    return None


def labels_problems(labels: object, path: str) -> Iterator[MetaProblem]:
    """Problems of a ``labels`` map (ValidateLabels)."""
    if labels is None:
        return
    if not isinstance(labels, dict):
        yield path, "must be a mapping of label keys to string values"
        return
    for key, value in labels.items():
        where = f"{path}[{key!r}]"
        why = qualified_name_problem(str(key))
        if why:
            yield where, f"label key {key!r}: {why}"
        why = label_value_problem(value)
        if why:
            yield where, f"label value {value!r}: {why}"


def annotations_problems(annotations: object, path: str) -> Iterator[MetaProblem]:
    """Problems of an ``annotations`` map (ValidateAnnotations)."""
    if annotations is None:
        return
    if not isinstance(annotations, dict):
        yield path, "must be a mapping of annotation keys to string values"
        return
    size = 0
    for key, value in annotations.items():
        why = qualified_name_problem(str(key).lower())
        if why:
            yield f"{path}[{key!r}]", f"annotation key {key!r}: {why}"
        if not isinstance(value, str):
            yield f"{path}[{key!r}]", (f"is {type(value).__name__} {value!r}: annotation "
                                       "values are strings; quote it")
        size += len(str(key)) + len(str(value))
    if size > MAX_ANNOTATIONS:
        yield path, f"are {size} bytes; the limit is {MAX_ANNOTATIONS}"


def object_meta_problems(meta: object, namespaced: bool = True,
                         names: bool = True) -> Iterator[MetaProblem]:
    """Problems of a custom resource's ``metadata`` on create (ValidateObjectMetaAccessor with
    NameIsDNSSubdomain, after the name is generated: a custom resource's name is a DNS-1123
    subdomain, apiextensions-apiserver's validator.go). ``names=False`` leaves name and
    generateName to the caller (a core kind with a rule of its own)."""
    if not isinstance(meta, dict):
        yield "metadata", "is required and must be a mapping (with name or generateName)"
        return
    for key in meta:
        if key not in OBJECT_META:
            yield f"metadata.{key}", "is not a field of ObjectMeta"
    if names:
        yield from _names(meta)
    yield from _after_names(meta, namespaced)


def _names(meta: dict[str, Any]) -> Iterator[MetaProblem]:
    name, prefix = meta.get("name"), meta.get("generateName")
    for field, value in (("name", name), ("generateName", prefix)):
        if value is not None and not isinstance(value, str):
            yield f"metadata.{field}", f"is {type(value).__name__} {value!r}: it is a string"
    if isinstance(prefix, str) and prefix:
        # NameIsDNSSubdomain(prefix=true): a generateName may end in '-'
        why = subdomain_problem(prefix[:-1] + "a" if prefix.endswith("-") else prefix)
        if why:
            yield "metadata.generateName", f"{prefix!r} {why}"
    full = effective_name(meta)
    if full is None:
        yield "metadata.name", "name or generateName is required"
    elif subdomain_problem(full):
        yield ("metadata.name" if name else "metadata.generateName",
               f"{full!r} {subdomain_problem(full)}")


def _after_names(meta: dict[str, Any], namespaced: bool) -> Iterator[MetaProblem]:
    namespace = meta.get("namespace")
    if namespace is not None:
        if not namespaced:
            yield "metadata.namespace", "not allowed on a cluster-scoped object"
        elif not isinstance(namespace, str) or len(namespace) > DNS_LABEL_MAX \
                or not DNS_1123_LABEL.fullmatch(namespace):
            yield "metadata.namespace", (f"{namespace!r} must be a lowercase RFC 1123 label "
                                         f"(at most {DNS_LABEL_MAX} characters)")
    yield from labels_problems(meta.get("labels"), "metadata.labels")
    yield from annotations_problems(meta.get("annotations"), "metadata.annotations")
    finalizers = meta.get("finalizers")
    if finalizers is not None and not (isinstance(finalizers, list) and all(
            isinstance(f, str) and not qualified_name_problem(f) for f in finalizers)):
        yield "metadata.finalizers", "must be a list of qualified names"


def template_meta_problems(meta: Any, path: str) -> Iterator[MetaProblem]:
    """Labels and annotations of a pod template's ``metadata``: the CRDs do not check them, but
    the pods the operator makes from the template are refused by Pod validation."""
    if isinstance(meta, dict):
        yield from labels_problems(meta.get("labels"), f"{path}.labels")
        yield from annotations_problems(meta.get("annotations"), f"{path}.annotations")
