"""``python -m trainer`` and ``torchrun -m trainer``."""

import sys

from trainer.train import main

if __name__ == "__main__":
    sys.exit(main())
