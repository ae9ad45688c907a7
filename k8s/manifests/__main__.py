"""``python -m torchjob.k8s.manifests``: regenerate the rendered example jobs in k8s/manifests/."""

from torchjob.k8s.manifests import regenerate_manifests

for path in regenerate_manifests():
    print(path)
