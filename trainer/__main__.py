"""``python -m trainer`` and ``torchrun -m trainer``."""

import sys

from trainer.preempt import ignore_stop_signals
from trainer.train import main

if __name__ == "__main__":
    code = main()
    if code == 0:
        ignore_stop_signals()  # e.g. srun's time-limit USR2 landing while the process exits
    sys.exit(code)
