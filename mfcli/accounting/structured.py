"""Former home of the structured-artifact accounting path. A structured strategy (banded Toeplitz,
BLT) is now accounted by the one path of every kind, :func:`mfcli.accounting.session.account`,
through its :class:`mfcli.operators.Mechanism` (:class:`mfcli.structured.StructuredOperator`).

Only a re-export is left, for ``mfcli.plan`` (it imports :func:`banded_numbers` from here); it goes
when that import reads ``mfcli.structured``.
"""
from __future__ import annotations

from mfcli.structured import banded_numbers

__all__ = ["banded_numbers"]
