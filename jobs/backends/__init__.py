"""Backends that live in the jobs package: local (torchrun agents here), docker (compose),
torchx (any TorchX scheduler). Slurm and Kubernetes have their own top-level packages."""
