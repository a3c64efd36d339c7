"""Accounting of structured artifacts (banded Toeplitz, BLT; :mod:`mfcli.structured`) in every
setting that applies, from the parameters where no dense C is needed (docs/accounting.md,
"Structured artifacts").

* at every n, from the parameters in O(n): the Gaussian at the schema sensitivity (single-pass /
  deterministic, the strategy's own ``sensitivity(n, schema)``) and cyclic Poisson sampling
  (2306.08153 Thm. 3 needs only the band count and the max column norm ||c||_2: the first column
  of a lower-triangular Toeplitz C is the longest), with calibration and ``--write`` records;
* DP-SGD (the reference row under Poisson sampling) at every n: it is n Poisson-subsampled
  Gaussian steps at sigma and needs neither C nor its sensitivity;
* n <= :data:`STRUCTURED_DENSE_MAX_N`: C is also materialised from its Toeplitz coefficients
  (``strategy_coefs(n)``, a BLT's from its buffers) for what needs the matrix (MMCC under Poisson
  sampling), run exactly as for a dense artifact with that C; above it MMCC is refused with the
  limit (calibrating it, or a Poisson run that asks for MMCC alone) or left out with a note
  (``AccountingReport.notes``) beside DP-SGD.

The limit is the one every dense artifact has (``mfcli.toeplitz.DENSE_MAX_N``, 8192; C alone is
n^2 doubles, 512 MiB there); MMCC itself then enforces its memory budget (``max_memory``) as for a
dense artifact of the same n.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mfcli.accounting.defaults import SETTINGS
from mfcli.errors import MfcliError
from mfcli.participation import Participation, SingleParticipation
from mfcli.progress import ProgressCallback
from mfcli.toeplitz import DENSE_MAX_N, BandedToeplitz, materialize

if TYPE_CHECKING:
    from mfcli.accounting.session import AccountingOptions, AccountingReport, StrategyInput

#: Above this n a structured artifact is accounted from its parameters only (no dense C, no MMCC).
STRUCTURED_DENSE_MAX_N = DENSE_MAX_N


def needs_dense(what: str, n: int) -> str:
    """The one-line refusal of a setting that needs the dense C above the limit."""
    return (f"{what} needs the dense strategy C, which is materialised from a structured artifact for "
            f"n <= {STRUCTURED_DENSE_MAX_N} only (this one has n = {n}); above that, a structured artifact is "
            "accounted without sampling (Gaussian at the schema sensitivity), under Poisson sampling by DP-SGD "
            "only (it needs no C) or, for banded Toeplitz, under cyclic Poisson sampling")


def structured_input(path: str | Path, *, operator: str = "auto") -> StrategyInput:
    """The :class:`~mfcli.accounting.session.StrategyInput` of a structured artifact: its C
    materialised at n <= :data:`STRUCTURED_DENSE_MAX_N` (accounted like a dense artifact), empty
    above (accounted from the parameters, :func:`account_parameters`). The operator is the
    artifact's :class:`mfcli.structured.StructuredOperator` (label and ``identity_sha256``, so
    ``--write`` records name it and inspect re-verifies against it).

    Raises:
        MfcliError: the artifact does not verify, or ``operator`` is ``compressed``.
    """
    from mfcli.accounting.session import StrategyInput
    from mfcli.artifact import load_structured_artifact

    if operator not in ("auto", "dense"):
        raise MfcliError(f"a structured artifact has one operator (its parameters); operator {operator!r} does not apply")
    art = load_structured_artifact(path)
    op = art.operator()
    n = art.n
    c = materialize(art.strategy.strategy_coefs(n), n) if n <= STRUCTURED_DENSE_MAX_N else np.zeros((0, 0))
    return StrategyInput(
        name=art.kind, strategy=c, release_steps=np.arange(n) if c.size else np.zeros(0, dtype=np.int64),
        source=f"artifact {path}: {op.label} strategy for the {art.workload.describe()} workload, n = {n}"
               + ("" if c.size else " (accounted from its parameters: no dense C)"),
        artifact=Path(path), operator=op.label, operator_sha256=op.identity_sha256,
        participation=art.participation, structured=art,
    )


def banded_numbers(strategy: Any, n: int) -> tuple[int, float]:
    """(bands, max column norm) of a lower-triangular Toeplitz C from its first column c (cut at
    n), all 2306.08153 Thm. 3 needs: the band count is 1 + the last non-zero index of c and the
    longest column is the first, ||c||_2. O(n). (A BLT's C has non-zero entries all the way down,
    so it meets the theorem's condition only with one cycle of n groups.)

    Raises:
        MfcliError: an all-zero C.
    """
    c = np.asarray(strategy.coefs if isinstance(strategy, BandedToeplitz) else strategy.strategy_coefs(n),
                   dtype=np.float64)[:n]
    nz = np.nonzero(c)[0]
    if nz.size == 0:
        raise MfcliError("the strategy is all zeros")
    # the certified single-participation sensitivity (never below ||c||; issue 26 item 1)
    return int(nz[-1]) + 1, float(strategy.sensitivity(n, SingleParticipation()).value)


def _schema_sensitivity(inp: StrategyInput, schema: Participation) -> Any:
    return inp.structured.strategy.sensitivity(inp.n, schema)


def _without_parameters(inp: StrategyInput) -> StrategyInput:
    """The same input as a plain dense C (for the settings that need the matrix: MMCC, DP-SGD)."""
    import dataclasses

    return dataclasses.replace(inp, structured=None)


#: Settings computed from the parameters at every n; the others need the dense C.
PARAMETER_SETTINGS = ("single-pass", "deterministic", "cyclic-poisson")
#: Settings that need no C at all (DP-SGD: n Poisson-subsampled Gaussian steps at sigma).
MATRIX_FREE_SETTINGS = ("dp-sgd",)


def account_parameters(
    inp: StrategyInput,
    *,
    sigma: float,
    sampling: float | None,
    options: AccountingOptions | None = None,
    settings: Sequence[str] = SETTINGS,
    participation: Participation | None = None,
    batching: str | None = None,
    progress: Callable[[str], None] | None = None,
    on_progress: ProgressCallback | None = None,
) -> AccountingReport:
    """:func:`mfcli.accounting.session.account` for a structured artifact. From the parameters at
    any n, in O(n): single-pass (single participation) or deterministic (the schema's sensitivity,
    the strategy's own ``sensitivity(n, schema)``), and with ``batching`` ``cyclic`` the
    cyclic-Poisson reduction (:func:`mfcli.accounting.multi.reduced_dpsgd` with
    :func:`banded_numbers`). The settings of the other batch samplers (Poisson: DP-SGD and MMCC)
    run on the materialised C at n <= :data:`STRUCTURED_DENSE_MAX_N` exactly as for a dense
    artifact. Above it, DP-SGD (which needs no C) still runs and MMCC is left out with a note in
    the report's ``notes``; only a Poisson run that would compute nothing but MMCC is refused.

    Raises:
        MfcliError: a setting that needs the dense C above the limit (:func:`needs_dense`); cyclic
            Poisson with more bands than the cycle length.
    """
    import dataclasses

    from mfcli.accounting.defaults import BATCHING_SETTINGS
    from mfcli.accounting.multi import deterministic, reduced_dpsgd
    from mfcli.accounting.session import AccountingOptions, AccountingReport, account, check_batching, resolve_schema
    from mfcli.accounting.single_pass import check_sampling, check_sigma, single_pass

    opts = (options or AccountingOptions()).checked()
    sigma = check_sigma(sigma)
    batching = check_batching(batching, sampling)
    if sampling is not None:
        sampling = check_sampling(sampling)
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        raise MfcliError(f"unknown setting {unknown[0]!r}; choose from {', '.join(SETTINGS)}")
    schema = resolve_schema(inp, participation)
    dense_report = None
    notes: tuple[str, ...] = ()
    if batching == "poisson" and not inp.dense:
        from mfcli.accounting.single_pass import dpsgd

        assert sampling is not None  # check_batching: poisson needs a rate
        if "dp-sgd" not in settings:
            raise MfcliError(needs_dense("the poisson batch sampler (MMCC)", inp.n))
        dp = dpsgd(sigma=sigma, sampling=sampling, steps=inp.n, delta=opts.delta,
                   value_discretization=opts.value_discretization)
        if "mmcc" in settings:
            notes = (f"MMCC: not run; it needs the dense strategy C, which is materialised from a structured "
                     f"artifact for n <= {STRUCTURED_DENSE_MAX_N} only (this one has n = {inp.n}); DP-SGD needs no C "
                     "and is shown",)
        return AccountingReport(strategy=inp, sigma=sigma, sampling=sampling, delta=opts.delta, dp_sgd=dp,
                                participation=schema, batching=batching, notes=notes)
    if batching not in (None, "cyclic"):
        if not inp.dense:
            raise MfcliError(needs_dense(f"the {batching} batch sampler (its settings)", inp.n))
        dense_report = account(_without_parameters(inp), sigma=sigma, sampling=sampling, options=opts,
                               settings=[s for s in settings if s not in PARAMETER_SETTINGS], progress=progress,
                               participation=schema, batching=batching, on_progress=on_progress)
        settings = [s for s in settings if s in BATCHING_SETTINGS.get(str(batching), SETTINGS)]
    single = isinstance(schema, SingleParticipation)
    sp = det = cyc = None
    if "single-pass" in settings and single:
        sp = single_pass(sigma=sigma, sensitivity=inp.sensitivity, delta=opts.delta)
    if "deterministic" in settings and not single:
        det = deterministic(sigma=sigma, sensitivity=_schema_sensitivity(inp, schema), n=inp.n, delta=opts.delta)
    if batching == "cyclic" and "cyclic-poisson" in settings:
        assert sampling is not None  # check_batching: cyclic needs a rate
        bands, col = banded_numbers(inp.structured.strategy, inp.n)
        cyc = reduced_dpsgd(bands=bands, column_norm=col, n=inp.n, schema=schema, sigma=sigma, sampling=sampling,
                            delta=opts.delta, value_discretization=opts.value_discretization)
    if dense_report is not None:
        return dataclasses.replace(dense_report, strategy=inp, single_pass=sp, deterministic=det)
    return AccountingReport(strategy=inp, sigma=sigma, sampling=sampling, delta=opts.delta, single_pass=sp,
                            deterministic=det, cyclic_poisson=cyc, participation=schema, batching=batching)


def epsilon_function_parameters(
    inp: StrategyInput,
    setting: str,
    *,
    sampling: float | None,
    options: AccountingOptions | None = None,
    participation: Participation | None = None,
) -> Callable[[float], float]:
    """epsilon(sigma) of one setting for a structured artifact (for calibration): single-pass,
    deterministic and cyclic-poisson from the parameters at any n; the others on the materialised
    C at n <= :data:`STRUCTURED_DENSE_MAX_N` (:func:`mfcli.accounting.session.epsilon_function`).

    Raises:
        MfcliError: a setting that needs the dense C above the limit, or whose conditions fail.
    """
    from mfcli.accounting.multi import deterministic, reduced_dpsgd
    from mfcli.accounting.session import AccountingOptions, check_setting_schema, epsilon_function, resolve_schema
    from mfcli.accounting.single_pass import check_sampling, single_pass

    opts = (options or AccountingOptions()).checked()
    schema = resolve_schema(inp, participation)
    check_setting_schema(setting, schema, inp.n)
    n = inp.n
    if setting == "single-pass":
        sens = inp.sensitivity
        return lambda s: single_pass(sigma=s, sensitivity=sens, delta=opts.delta).epsilon
    if setting == "deterministic":
        sch = _schema_sensitivity(inp, schema)
        return lambda s: deterministic(sigma=s, sensitivity=sch, n=n, delta=opts.delta).epsilon
    if setting == "cyclic-poisson":
        if sampling is None:
            raise MfcliError("calibrating cyclic-poisson needs a sampling rate")
        p = check_sampling(sampling)
        bands, col = banded_numbers(inp.structured.strategy, n)

        def eps(s: float) -> float:
            return reduced_dpsgd(bands=bands, column_norm=col, n=n, schema=schema, sigma=s, sampling=p,
                                 delta=opts.delta, value_discretization=opts.value_discretization).epsilon

        eps(1.0)  # refuse now (more bands than the cycle), not inside the search
        return eps
    if setting == "dp-sgd" and not inp.dense:
        from mfcli.accounting.single_pass import dpsgd

        if sampling is None:
            raise MfcliError("calibrating dp-sgd needs a sampling rate")
        p = check_sampling(sampling)
        return lambda s: dpsgd(sigma=s, sampling=p, steps=n, delta=opts.delta,
                               value_discretization=opts.value_discretization).epsilon
    if setting in SETTINGS and not inp.dense:
        raise MfcliError(needs_dense(f"the {setting} setting", n))
    return epsilon_function(_without_parameters(inp), setting, sampling=sampling, options=opts, participation=schema)


# Records (account --write) of a structured artifact are verified by the one verifier of every
# kind, mfcli.accounting.records.verify_record (its subject: records.structured_subject).


__all__ = [
    "MATRIX_FREE_SETTINGS",
    "STRUCTURED_DENSE_MAX_N",
    "account_parameters",
    "banded_numbers",
    "epsilon_function_parameters",
    "needs_dense",
    "structured_input",
]
