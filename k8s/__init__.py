"""Kubernetes backend: PyTorchJob and TrainJob rendering, validation and client (coming in its own issue)."""
