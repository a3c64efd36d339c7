"""Errors that mfcli reports to users.

Every problem with user input (a bad option, a malformed matrix, a tampered artifact) is raised as
:class:`MfcliError` with a one-line message that names the problem. The CLI prints that line and
exits non-zero; library users can catch the class.
"""
from __future__ import annotations


class MfcliError(Exception):
    """A user-facing error: bad input, an invalid file, or an unmet requirement."""


class ArtifactError(MfcliError):
    """An artifact is missing, truncated, tampered with or inconsistent."""
