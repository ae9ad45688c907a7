"""The containerized trainer: reads its place in the world from the environment and trains.

Needs only torch (plus numpy, scikit-learn's data file, matplotlib and tqdm); imports nothing
from the launcher side (jobs, k8s, slurm).
"""
