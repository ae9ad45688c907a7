"""``python -m jobs``: the same as the ``torchjob`` command."""

from jobs.cli import main

raise SystemExit(main())
