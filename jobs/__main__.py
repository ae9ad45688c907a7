"""``python -m torchjob.jobs``: the same as the ``torchjob`` command."""

from torchjob.jobs.cli import main

raise SystemExit(main())
