"""Where the suite's time goes, for work on its length (the brief's 45 minutes): with
``TORCHJOB_TEST_CPU=FILE`` each test's wall time, the CPU of the processes it started and
waited for (``RUSAGE_CHILDREN``: not a container's, nor a Slurm job's), this process's own and
the whole machine's busy core-seconds while it ran (shared with the other worker's test) go to
``FILE.<worker>`` as JSON lines. ``python -m tests.cpu_use FILE...``: the tests by CPU."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections.abc import Iterator
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: object) -> Iterator[None]:
    target = os.environ.get(CPU_ENV)
    if not target:
        yield
        return
    start = time.time()
    before = (time.monotonic(), cpu_s(resource.RUSAGE_CHILDREN), cpu_s(resource.RUSAGE_SELF),
              busy_core_s())
    yield
    after = (time.monotonic(), cpu_s(resource.RUSAGE_CHILDREN), cpu_s(resource.RUSAGE_SELF),
             busy_core_s())
    wall, children, own, machine = (round(b - a, 2) for a, b in zip(before, after))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(f"{target}.{worker}", "a") as f:
        f.write(json.dumps({"test": item.nodeid, "start": round(start, 2), "wall": wall,
                            "children": children, "own": own, "machine": machine}) + "\n")


def main(paths: list[str]) -> None:
    rows: list[dict[str, Any]] = []
    for path in paths:
        with open(path) as f:
            rows += [json.loads(line) for line in f]
    by_file: dict[str, list[float]] = {}
    for row in rows:
        sums = by_file.setdefault(row["test"].split("::")[0], [0.0, 0.0, 0.0])
        for i, key in enumerate(("wall", "children", "machine")):
            sums[i] += row[key] + (row["own"] if key == "children" else 0)
    print(f"{'wall s':>8} {'cpu s':>8} {'machine':>8}  file (cpu: its processes and pytest's)")
    for name, (wall, cpu, machine) in sorted(by_file.items(), key=lambda kv: -kv[1][1]):
        print(f"{wall:8.0f} {cpu:8.0f} {machine:8.0f}  {name}")
    print(f"{sum(r['wall'] for r in rows):8.0f} "
          f"{sum(r['children'] + r['own'] for r in rows):8.0f}  in all ({len(rows)} tests)")
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
