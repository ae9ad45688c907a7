"""Slurm backend: the sbatch renderer (``sbatch``), submission through submitit with requeue
(``submitit_job``), Slurm's command line (``slurm_cli``) and per-attempt logs (``slurm_logs``).
``slurm/devcluster`` runs a real two-node Slurm cluster on this host for trying it and for tests.
"""
