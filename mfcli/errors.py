"""Errors that mfcli reports to users, and how they relate to Python's built-in ones.

* :class:`MfcliError` is bad input: a bad parameter value, a malformed matrix, a tampered
  artifact, an unmet requirement. It subclasses :class:`ValueError`, the idiom numpy, scipy and
  dp-accounting use, so ``except ValueError`` around a library call catches it; ``except
  MfcliError`` catches only mfcli's own. Messages are one line and name the offending parameter
  (by its Python name, never a command-line flag) or entry.
* :class:`ArtifactError` (a :class:`MfcliError`) is a file that is missing, truncated, tampered
  with or inconsistent.
* :class:`OutputExistsError` (a :class:`MfcliError`) is an output file that exists where
  overwriting was not asked for (``force=False``); the CLI adds the ``--force`` hint.
* :class:`NoiseStreamExhaustedError` (a :class:`MfcliError`) is a noise stream asked for step
  t >= n: the artifact covers n steps and noise past the end is refused, never invented.
* A wrong argument *type* (a string where a number or an artifact is expected) is a programming
  mistake, not bad data, and is raised as a plain :class:`TypeError`.

Anything else escaping mfcli (a ``ZeroDivisionError``, a ``KeyError``) is a bug. The CLI prints
MfcliError as one ``error:`` line and exits 1; a bug exits 70 with its traceback.
"""
from __future__ import annotations


class MfcliError(ValueError):
    """Bad input: a bad value, an invalid file, or an unmet requirement (a ``ValueError``)."""


class ArtifactError(MfcliError):
    """An artifact is missing, truncated, tampered with or inconsistent."""


class OutputExistsError(MfcliError):
    """The output file exists and overwriting was not asked for (``force=False``)."""


class NoiseStreamExhaustedError(MfcliError):
    """A noise stream (or an export of one) was asked for step t >= n, past the artifact's end."""
