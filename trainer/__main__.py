"""``python -m torchjob.trainer`` and ``torchrun -m torchjob.trainer``."""

from torchjob.trainer.preempt import ignore_stop_signals
from torchjob.trainer.script import leave
from torchjob.trainer.train import main

if __name__ == "__main__":
    code = main()
    if code == 0:
        ignore_stop_signals()  # e.g. srun's time-limit USR2 landing while the process exits
    leave(code)  # without the C++ teardown, where a compiled model's threads can abort it
