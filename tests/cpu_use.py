"""Where the suite's time goes, for work on its length (the brief's 45 minutes): with
``TORCHJOB_TEST_CPU=FILE`` each test's wall time, the CPU of the processes it started and
waited for (``RUSAGE_CHILDREN``), this process's own, the whole machine's busy core-seconds
while it ran (shared with the other worker's test) and, as root, ``tree``: every process
started during it, waited for or not (a cgroup of the test's own; not a container's nor a
Slurm job's, which their engines start) go to ``FILE.<worker>`` as JSON lines.
``python -m tests.cpu_use FILE...``: the tests by CPU."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CPU_ENV = "TORCHJOB_TEST_CPU"


def busy_core_s() -> float:
    """The machine's busy time since boot, in core-seconds (/proc/stat: all but idle, iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def cpu_s(who: int) -> float:
    use = resource.getrusage(who)
    return use.ru_utime + use.ru_stime


class TreeCpu:
    """The CPU of every process started while it is open, however it ends (an agent's fork
    server, reparented to init, escapes ``RUSAGE_CHILDREN``): this process moves into a
    cgroup of its own, which its children inherit, and back out at ``close``. None where no
    cgroup can be made (not root; no cpuacct nor cgroup v2)."""

    V1, V2 = Path("/sys/fs/cgroup/cpuacct"), Path("/sys/fs/cgroup")

    def __init__(self, name: str) -> None:
        if (self.V1 / "cgroup.procs").exists():
            self.root, self.home = self.V1, _own_cgroup("cpuacct")
        elif (self.V2 / "cgroup.controllers").exists():
            self.root, self.home = self.V2, _own_cgroup("")
        else:
            raise OSError("neither a cpuacct hierarchy nor cgroup v2 here")
        self.dir = self.root / "torchjob-tests" / hashlib.md5(name.encode()).hexdigest()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.before = self.used()  # the same test in an earlier run used it too
        (self.dir / "cgroup.procs").write_text(str(os.getpid()))

    @classmethod
    def open(cls, name: str) -> "TreeCpu | None":
        try:
            return cls(name)
        except OSError:
            return None

    def used(self) -> float:
        """The CPU of every process that ever was in the cgroup, in seconds."""
        if (usage := self.dir / "cpuacct.usage").exists():
            return int(usage.read_text()) / 1e9
        stat = dict(line.split() for line in (self.dir / "cpu.stat").read_text().splitlines())
        return int(stat["usage_usec"]) / 1e6

    def close(self) -> float:
        """Back where this process was; the CPU its tree used meanwhile, in seconds."""
        (self.root / self.home.lstrip("/") / "cgroup.procs").write_text(str(os.getpid()))
        used = self.used() - self.before
        try:
            self.dir.rmdir()  # unless a process the test started still runs there
        except OSError:
            pass
        return used


def _own_cgroup(controller: str) -> str:
    """This process's cgroup in the hierarchy of ``controller`` ("": cgroup v2's)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if (controller in names.split(",")) if controller else not names:
            return path
    raise OSError(f"no {controller or 'v2'} cgroup in /proc/self/cgroup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: object) -> Iterator[None]:
    target = os.environ.get(CPU_ENV)
    if not target:
        yield
        return
    start = time.time()
    tree = TreeCpu.open(item.nodeid)
    before = (time.monotonic(), cpu_s(resource.RUSAGE_CHILDREN), cpu_s(resource.RUSAGE_SELF),
              busy_core_s())
    try:
        yield
    finally:
        tree_s = tree.close() if tree is not None else None
    after = (time.monotonic(), cpu_s(resource.RUSAGE_CHILDREN), cpu_s(resource.RUSAGE_SELF),
             busy_core_s())
    wall, children, own, machine = (round(b - a, 2) for a, b in zip(before, after))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    row = {"test": item.nodeid, "start": round(start, 2), "wall": wall, "children": children,
           "own": own, "machine": machine}
    if tree_s is not None:
        row["tree"] = round(tree_s, 2)
    with open(f"{target}.{worker}", "a") as f:
        f.write(json.dumps(row) + "\n")


def cpu_of(row: dict[str, Any]) -> float:
    """A test's CPU: its whole tree's where that was counted (it holds pytest's own), else
    the processes it waited for and pytest's."""
    return float(row["tree"] if "tree" in row else row["children"] + row["own"])


def main(paths: list[str]) -> None:
    rows: list[dict[str, Any]] = []
    for path in paths:
        with open(path) as f:
            rows += [json.loads(line) for line in f]
    by_file: dict[str, list[float]] = {}
    for row in rows:
        sums = by_file.setdefault(row["test"].split("::")[0], [0.0, 0.0, 0.0])
        for i, value in enumerate((row["wall"], cpu_of(row), row["machine"])):
            sums[i] += value
    print(f"{'wall s':>8} {'cpu s':>8} {'machine':>8}  file (cpu: its processes and pytest's)")
    for name, (wall, cpu, machine) in sorted(by_file.items(), key=lambda kv: -kv[1][1]):
        print(f"{wall:8.0f} {cpu:8.0f} {machine:8.0f}  {name}")
    print(f"{sum(r['wall'] for r in rows):8.0f} "
          f"{sum(cpu_of(r) for r in rows):8.0f}  in all ({len(rows)} tests)")
    idle(rows)


def idle(rows: list[dict[str, Any]], top: int = 25) -> None:
    """The tests during which the machine's cores stood idle longest (its cores times the
    test's wall time, less the busy core-seconds), with what the other workers ran then."""
    cores = os.cpu_count() or 1
    timed = [r for r in rows if "start" in r and r["wall"] >= 5]
    print(f"\n{'idle':>8} {'wall s':>8}  test (the machine's {cores} cores): and beside it")
    for row in sorted(timed, key=lambda r: r["machine"] - cores * r["wall"])[:top]:
        end = row["start"] + row["wall"]
        beside = sorted({o["test"].split("::")[0] for o in timed if o is not row
                         and o["start"] < end and o["start"] + o["wall"] > row["start"]})
        print(f"{cores * row['wall'] - row['machine']:8.0f} {row['wall']:8.0f}  "
              f"{row['test'][:90]}: {', '.join(beside)[:200]}")


if __name__ == "__main__":
    main(sys.argv[1:])
