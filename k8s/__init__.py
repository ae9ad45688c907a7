"""Kubernetes backend: PyTorchJob and TrainJob rendering and validation (the client comes later).

- ``render_pytorchjob(spec) -> dict``, ``render_trainjob(spec) -> dict``: pure renderers.
- ``manifest_text(obj) -> str``: the YAML for ``kubectl apply -f -``.
- ``render_manifest(spec, target)``: render + validate + text, for ``torchjob render``.
- ``validate(obj) -> list[Problem]``, ``validate_text(text)``: CRD schema, admission rules,
  Pod Security "restricted", no literal secrets; each problem names its rule and field path.
- ``python -m k8s.manifests``: regenerate the rendered examples in ``k8s/manifests/``.
"""
