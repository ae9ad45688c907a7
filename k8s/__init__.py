"""Kubernetes backend: PyTorchJob and TrainJob rendering, validation, and the cluster client.

- ``render_pytorchjob(spec) -> dict``, ``render_trainjob(spec) -> dict``: pure renderers.
- ``manifest_text(obj) -> str``: the YAML for ``kubectl apply -f -``.
- ``render_store(spec) -> list[dict]`` (``torchjob.k8s.store``): an elastic PyTorchJob's rendezvous
  store, a Deployment and the Service ``<job>-rdzv`` its agents meet at.
- ``render_objects(spec, target)``: the job (and its store objects), validated;
  ``render_manifest(spec, target)``: their text (multi-document YAML), for ``torchjob render``.
- ``validate(obj) -> list[Problem]``, ``validate_text(text)``: CRD schema, admission rules,
  Pod Security "restricted", no literal secrets (Deployments and Services: structure and
  restricted pods); each problem names its rule and field path.
- ``torchjob.k8s.client.Cluster``: submit, status, logs and cancel on a cluster (kubeconfig or the
  in-cluster account); API errors become one-line ``K8sError``s that say what to do.
- ``k8s.backend``: the ``k8s`` and ``k8s:trainjob`` backends of the registry (jobs.backend).
- ``python -m torchjob.k8s.manifests``: regenerate the rendered examples in ``k8s/manifests/``.
"""
