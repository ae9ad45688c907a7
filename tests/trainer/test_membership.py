"""trainer.membership's part of torch's c10d rendezvous: the name each recorded operation gets."""

from __future__ import annotations

import inspect

from torch.distributed.elastic.rendezvous import dynamic_rendezvous

from torchjob.trainer.membership import method_name


def test_c10d_names_its_operations_as_torch_did_without_reading_the_stacks_source() -> None:
    def record() -> tuple[str, str]:  # as c10d's _record: the method that called it
        return dynamic_rendezvous.get_method_name(), inspect.stack()[1].function

    def next_rendezvous() -> tuple[str, str]:
        return record()

    assert dynamic_rendezvous.get_method_name is method_name
    assert next_rendezvous() == ("next_rendezvous", "next_rendezvous")
    assert method_name(len(inspect.stack()) + 1) == "no_method_name"
