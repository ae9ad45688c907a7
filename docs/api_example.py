"""The Python API as a notebook would use it (README, "Python API"): load a job with
overrides, submit it to this machine, wait for it, then its status, the tail of its logs and
the runs listed. Run it from any directory: its runs/ directory is written there."""

from pathlib import Path

from torchjob.jobs.api import load, logs, runs, status, submit, wait

JOB = Path(__file__).resolve().parents[1] / "jobs" / "examples" / "default.yaml"

spec = load(JOB, ["trainer.args.max_steps=10", "nproc_per_node=1"])  # as --set does
handle = submit(spec, to="local")  # started detached; str(handle) is local:digits-1a2b3c
print("submitted", handle)
final = wait(handle, timeout=600)  # once it has ended; a TimeoutError if it has not by then
print(final.state.value, final.exit_code)  # SUCCEEDED 0
print(status(str(handle)).run_dir)  # a handle or its text, as torchjob status takes it
for line in list(logs(handle, rank=0))[-2:]:  # rank 0's last lines
    print(line)
print(handle in [job.handle for job in runs(to="local")])  # True: torchjob list shows it
