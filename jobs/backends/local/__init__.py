"""The local backend: torchrun agents on this machine, one per emulated node."""
