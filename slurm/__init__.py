"""Slurm backend: the batch script (``sbatch``: the renderer; ``job.sh``: its shell), the
backend (``backend``: ``slurm`` through submitit, whose executor ``executor`` submits that
script; ``slurm:sbatch`` with plain sbatch), Slurm's command line (``cluster``), a job's
state and exit code from accounting (``status``) and its logs per attempt and rank
(``logs``). ``slurm/devcluster`` runs a real two-node Slurm cluster on this host.
"""
