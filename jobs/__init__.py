"""torchjob's launcher side: the job spec, its renderers, the launcher and the command line.

Nothing in ``trainer/`` imports this package; this package may import ``torchjob.trainer.config`` to
check a job's trainer arguments before anything starts.
"""
