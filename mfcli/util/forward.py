"""A member an object passes through from one of its own parts, stated in one line
(:class:`Forwarded`). Standard library only (layer 0 of docs/architecture.md)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

_T = TypeVar("_T")


class Forwarded(Generic[_T]):
    """The member ``part.attr`` of the object's own ``part``, converted by ``convert`` where given:
    what a kind passes through unchanged from what it is built on (the verified factorization, the
    banded plus low-rank decoder), or what a wrapper shares with the object it wraps. Read-only
    unless ``writable`` (then an assignment goes to ``part.attr``, as the wrapped object's own)."""

    def __init__(self, part: str, attr: str, convert: Callable[[Any], _T] | None = None, *,
                 writable: bool = False, doc: str | None = None) -> None:
        self.part, self.attr, self.convert, self.writable = part, attr, convert, writable
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Forwarded[_T]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> _T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> Forwarded[_T] | _T:
        if obj is None:
            return self
        value = getattr(getattr(obj, self.part), self.attr)
        return value if self.convert is None else self.convert(value)

    def __set__(self, obj: object, value: _T) -> None:
        if not self.writable:
            raise AttributeError(f"{type(obj).__name__}.{self.name} is read-only (it is {self.part}.{self.attr})")
        setattr(getattr(obj, self.part), self.attr, value)


__all__ = ["Forwarded"]
