"""mfcli.util.forward.Forwarded: a member passed through from one of an object's parts."""
from __future__ import annotations

from dataclasses import FrozenInstanceError, dataclass
from types import SimpleNamespace

import pytest

from mfcli.util.forward import Forwarded


class Holder:
    size = Forwarded[int]("part", "n", doc="n of the part.")
    total = Forwarded("part", "value", float)
    shared = Forwarded[list]("part", "items", writable=True)

    def __init__(self, part: SimpleNamespace) -> None:
        self.part = part


@dataclass(frozen=True)
class FrozenHolder:
    part: SimpleNamespace
    size = Forwarded[int]("part", "n")


def test_reads_the_parts_member_now_not_a_copy() -> None:
    part = SimpleNamespace(n=3, value=2, items=[1])
    h = Holder(part)
    assert h.size == 3
    part.n = 5   # a later change of the part shows through
    assert h.size == 5


def test_convert_applies_on_read() -> None:
    h = Holder(SimpleNamespace(n=1, value=7, items=[]))
    assert h.total == 7.0 and type(h.total) is float


def test_class_access_gives_the_descriptor_with_its_doc() -> None:
    assert isinstance(Holder.size, Forwarded)
    assert Holder.size.__doc__ == "n of the part."


def test_read_only_refuses_an_assignment_naming_what_it_forwards() -> None:
    h = Holder(SimpleNamespace(n=1, value=0, items=[]))
    with pytest.raises(AttributeError, match=r"Holder.size is read-only \(it is part.n\)"):
        h.size = 2
    assert h.part.n == 1


def test_writable_assigns_to_the_part() -> None:
    part = SimpleNamespace(n=1, value=0, items=[1])
    h = Holder(part)
    h.shared = [2, 3]
    assert part.items == [2, 3] and h.shared == [2, 3]


def test_a_frozen_dataclass_stays_frozen() -> None:
    h = FrozenHolder(SimpleNamespace(n=4))
    assert h.size == 4
    with pytest.raises(FrozenInstanceError):
        h.size = 1
