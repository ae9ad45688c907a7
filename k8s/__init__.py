"""Kubernetes backend: PyTorchJob and TrainJob rendering, validation, and the cluster client.

- ``render_pytorchjob(spec) -> dict``, ``render_trainjob(spec) -> dict``: pure renderers.
- ``manifest_text(obj) -> str``: the YAML for ``kubectl apply -f -``.
- ``render_manifest(spec, target)``: render + validate + text, for ``torchjob render``.
- ``validate(obj) -> list[Problem]``, ``validate_text(text)``: CRD schema, admission rules,
  Pod Security "restricted", no literal secrets; each problem names its rule and field path.
- ``k8s.client.Cluster``: submit, status, logs and cancel on a cluster (kubeconfig or the
  in-cluster account); API errors become one-line ``K8sError``s that say what to do.
- ``k8s.backend``: the ``k8s`` and ``k8s:trainjob`` backends of the registry (jobs.backend).
- ``python -m k8s.manifests``: regenerate the rendered examples in ``k8s/manifests/``.
"""
