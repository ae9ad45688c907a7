"""Example job specs, shipped as package data: ``torchjob run`` takes their paths
(``jobs/examples/default.yaml`` in a checkout, ``os.path.dirname(torchjob.jobs.examples.__file__)``
when installed). ``ddp_script.py`` is the user script ``script.yaml`` runs."""
