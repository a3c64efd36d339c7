"""From an accounting record to a private training run (docs/training.md).

An artifact written by ``mfcli plan --out`` or ``mfcli account --write`` carries accounting
records: the noise multiplier, the batch sampler, its rate and the epsilon that holds for that
combination. This package turns one record into the pieces a training loop needs and refuses
wiring that would train another mechanism than the one accounted.

* :mod:`mfcli.training.record` (no framework): :func:`~mfcli.training.record.training_record`
  picks and verifies a record, builds its batch sampler and reports its epsilon (per epoch where
  the accounting gives one).
* :mod:`mfcli.training.torch` (``pip install mfcli[torch]``): ``make_private`` and
  ``make_private_with_epsilon`` give a model, an optimizer that clips per example (``torch.func``)
  and adds the correlated noise, and a DataLoader over the record's batches; data-parallel too.

The submodules import their framework on import; this package imports none.
"""
from __future__ import annotations
