"""Kubernetes backend: PyTorchJob and TrainJob rendering, validation, and the cluster client.

Pure renderers (``pytorchjob``, ``trainjob``, ``store``; ``render_objects`` and
``render_manifest`` for ``torchjob render``), ``validate`` (CRD schemas, admission rules, Pod
Security "restricted", no literal secrets), ``client.Cluster`` (a live cluster), ``backend``
(the registry's ``k8s`` and ``k8s:trainjob``); ``python -m torchjob.k8s.manifests``
regenerates the examples in ``k8s/manifests/``.
"""
