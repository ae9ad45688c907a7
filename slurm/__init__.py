"""Slurm backend: sbatch rendering, submitit submission, local dev cluster (coming in its own issue)."""
