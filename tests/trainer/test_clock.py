"""The throughput clock syncs the device exactly where a rate is read from it: the warm-up's end
and an exact tick (a log line, the last step), never on the other steps (issue 23: the trainer's
tokens/s on a GPU is the device's, measured as the minimal loop measures its own)."""

from __future__ import annotations

from torchjob.trainer.clock import Throughput


def test_the_device_is_synced_at_the_warmup_end_and_exact_ticks_only() -> None:
    synced: list[int] = []
    clock = Throughput(warmup_steps=3, sync=lambda: synced.append(clock.steps))
    for step in range(1, 11):
        clock.tick(8, exact=step % 4 == 0 or step == 10)
    assert synced == [3, 4, 8, 10]
    assert clock.samples == 7 * 8 and clock.rate() > 0


def test_without_a_device_to_sync_the_clock_runs_as_before() -> None:
    clock = Throughput(warmup_steps=2)
    for _ in range(5):
        clock.tick(4, exact=True)
    assert clock.samples == 3 * 4 and clock.rate() > 0
    assert clock.eta(10) is not None
