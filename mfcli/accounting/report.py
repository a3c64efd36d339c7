"""Former name of :mod:`mfcli.accounting.session` (an accounting session: resolve, account,
calibrate, record, verify). Kept so that existing imports keep working; new code imports
:mod:`mfcli.accounting.session`."""
from __future__ import annotations

from mfcli.accounting.session import *
from mfcli.accounting.session import __all__  # noqa: F401
