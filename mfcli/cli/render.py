"""Presentation of ``compare`` tables for the command line: option parsing and text tables.

The library computes :class:`~mfcli.services.compare.Comparison` tables; this module turns them into what a
user reads (Markdown, CSV, a terminal table) and parses the comma-separated lists the options
accept. Plots live in :mod:`mfcli.cli.plots`. Messages here may name flags; the library's never do.
"""
from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable
from typing import Any

from rich import box
from rich.table import Table

from mfcli.cli.common import safe, safe_markup, usage_error
from mfcli.cli.rounding import pessimistic
from mfcli.services.compare import COLUMNS, Comparison
from mfcli.strategies.baselines import STRATEGY_NAMES

#: Compact headers for the terminal; the caption says what they mean.
SHORT_HEADERS = ("strategy", "causal", "sens", "total", "mean", "RMSE", "max step", "ratio")

#: The column added after the sensitivity under a multi-participation schema: (key, header, short header).
EXACT_COLUMN = ("sensitivity_exact", "sensitivity is", "sens is")


#: Columns added at equal privacy (``compare --epsilon``): (key, header, short header).
PRIVACY_COLUMNS = (
    ("accounting", "accounting at the target", "accounting"),
    ("sigma", "sigma at the target (rounded up)", "sigma@eps"),
    ("rmse_at_epsilon", "RMSE at the target (rounded up)", "RMSE@eps"),
)


def exactness(exact: bool) -> str:
    """How a row's sensitivity under a schema was established: ``exact`` or ``upper bound``."""
    return "exact" if exact else "upper bound"


def _headers(table: Comparison, *, short: bool) -> list[str]:
    heads = list(SHORT_HEADERS) if short else [h for _, h in COLUMNS]
    if table.multi:
        heads.insert(3, EXACT_COLUMN[2] if short else EXACT_COLUMN[1])
    if table.privacy is not None:
        heads += [c[2] if short else c[1] for c in PRIVACY_COLUMNS]
    return heads


def parse_strategy_names(values: Iterable[str] | None) -> tuple[str, ...]:
    """Split the comma-separated ``--strategies`` values, drop duplicates (keeping order), reject
    unknown ones. None or nothing means all of :data:`~mfcli.strategies.baselines.STRATEGY_NAMES`."""
    names: list[str] = []
    for value in values or ():
        for part in str(value).split(","):
            name = part.strip()
            if not name:
                continue
            if name not in STRATEGY_NAMES:
                raise usage_error(f"unknown strategy {name!r}; choose from {', '.join(STRATEGY_NAMES)}")
            if name not in names:
                names.append(name)
    if not names and values:
        raise usage_error("--strategies is empty; choose from " + ", ".join(STRATEGY_NAMES))
    return tuple(names) if names else STRATEGY_NAMES


def _num(v: Any, digits: int = 6) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if v == 0 or 1e-3 <= abs(v) < 1e7:
        return f"{v:.{digits}g}"
    return f"{v:.{max(digits - 2, 1)}e}"


def table_cells(table: Comparison) -> list[list[str]]:
    """Rows of display strings, in :data:`~mfcli.services.compare.COLUMNS` order. A row's name can come
    from an artifact (``--artifact``): control characters are shown escaped (:func:`safe`).

    Under a multi-participation schema a column after the sensitivity says ``exact`` or ``upper
    bound``; an upper bound's sensitivity and losses are rounded up, never down."""
    rows = []
    for r in table.rows:
        num = _num if r.sensitivity_exact else pessimistic
        cells = [
            safe(r.name),
            "yes" if r.causal else "no",
            num(r.sensitivity),
            num(r.loss_total),
            num(r.loss_mean),
            num(r.rmse),
            num(r.loss_max),
            _num(r.ratio, 4),
        ]
        if table.multi:
            cells.insert(3, exactness(r.sensitivity_exact))
        if r.privacy is not None:  # sigma and the error it causes decide privacy: rounded up
            cells += [r.privacy.accounting, pessimistic(r.privacy.sigma), pessimistic(r.privacy.rmse)]
        rows.append(cells)
    return rows


def title(table: Comparison) -> str:
    """``<workload> workload, n = N (params)``, then the schema when it is not single
    participation: the caption of every rendering."""
    params = ", ".join(f"{k}={v}" for k, v in sorted(table.workload_params.items()))
    text = f"{table.workload_name} workload, n = {table.n}" + (f" ({params})" if params else "")
    text = f"{text}, {table.participation.describe(table.n)}" if table.multi else text
    if table.privacy is not None:
        t = table.privacy
        sampler = "no sampling" if t.sampling is None else _cyclic_text(table)
        text += f"; at equal privacy epsilon = {t.epsilon:g}, delta = {t.delta:g}, {sampler}"
    return text


def _cyclic_text(table: Comparison) -> str:
    """The cyclic sampler in words, with the expected batch fraction P / b its per-group rate P
    implies (a user who passed batch / examples as P sees the mismatch)."""
    from mfcli.accounting.multi import cycle_length

    p = table.privacy.sampling if table.privacy is not None else None
    assert p is not None
    b = cycle_length(table.participation, table.n)
    return (f"cyclic Poisson sampling at per-group rate {p:g} (each example's group is sampled with probability "
            f"{p:g} at its group's steps; {b} groups, expected batch {p / b:.6g} of the examples)")


_SINGLE_OPTIMUM_BASIS = ("lowest causal total (optimal-single's: the single-participation optimum, not this "
                         "schema's optimum, which can be lower)")


def _single_optimum_lowest(table: Comparison) -> bool:
    """Whether the ratios are relative to ``optimal-single``, which is therefore not named best."""
    return table.best_causal is None and any(r.causal for r in table.rows)


def render_markdown(table: Comparison) -> str:
    """A GitHub-flavoured Markdown table with a caption line."""
    head = _headers(table, short=False)
    # The title names a non-single schema already; the units line then says the rest.
    units = "noise multiplier 1, clip norm 1; 'upper bound' rows: sensitivity and losses are upper bounds, rounded up"
    if _single_optimum_lowest(table):
        units += f"; ratio = total / {_SINGLE_OPTIMUM_BASIS}"
    lines = [
        f"**{title(table)}**; {units if table.multi else table.units()}",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|",
    ]
    for cells in table_cells(table):
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_csv(table: Comparison) -> str:
    """CSV with full-precision numbers (repr of the floats), one row per strategy."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    keys = [key for key, _ in COLUMNS]
    if table.multi:
        keys.insert(3, EXACT_COLUMN[0])
    if table.privacy is not None:
        keys += [c[0] for c in PRIVACY_COLUMNS]
    w.writerow([*keys, "m", "description"])
    for r in table.rows:
        cells: list[Any] = [
            safe(r.name), str(r.causal).lower(), repr(r.sensitivity), repr(r.loss_total), repr(r.loss_mean),
            repr(r.rmse), repr(r.loss_max), "" if math.isnan(r.ratio) else repr(r.ratio), r.m, safe(r.description),
        ]
        if table.multi:
            cells.insert(3, str(r.sensitivity_exact).lower())
        if r.privacy is not None:
            cells[-2:-2] = [r.privacy.accounting, repr(r.privacy.sigma), repr(r.privacy.rmse)]
        w.writerow(cells)
    return buf.getvalue()


def rich_table(table: Comparison) -> Table:
    """The terminal table (compact headers, a caption with the units)."""
    t = Table(
        title=safe_markup(title(table)),
        caption=f"squared errors (total, mean per step, worst step), {table.units()}; ratio = total / "
        + (_SINGLE_OPTIMUM_BASIS if _single_optimum_lowest(table) else "best causal total")
        + ("; 'upper bound' rows: sensitivity and losses are upper bounds, rounded up" if table.multi else ""),
        title_justify="left",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for i, head in enumerate(_headers(table, short=True)):
        t.add_column(head, justify="left" if i == 0 else "right", no_wrap=i == 0)
    for cells in table_cells(table):
        t.add_row(*(safe_markup(c) for c in cells))  # names from files are shown, not read as markup
    return t


# ---------------------------------------------------------------------------------------------
# The number to report (``account`` and ``plan``)

#: How the report line names a neighbouring relation.
NEIGHBOURING_WORDS = {
    "add-remove": "add or remove one example",
    "zero-out": "zero out one example of a fixed, public N",
    "replace-one": "replace one example (covers zeroing one out)",
}


def sampler_words(batching: str | None, sampling: float | None) -> str:
    """A batch sampler in the words of the report line."""
    if batching is None:
        return "no sampling"
    if batching == "poisson":
        return f"Poisson sampling at rate {sampling:g}"
    if batching == "cyclic":
        return f"cyclic Poisson sampling at per-group rate {sampling:g}"
    if batching == "balls-in-bins":
        return "balls-in-bins batching"
    if batching == "shuffle":
        return "one shuffled epoch"
    return str(batching)


def report_line(report: dict) -> str:
    """``report: epsilon <= X (delta, setting, batch sampler, participation, neighbouring relation)``
    from a report's JSON (:meth:`mfcli.services.account.Report.as_dict`); epsilon rounded up."""
    eps = report.get("epsilon")
    if eps is None or report.get("setting") is None:
        return "report: no guarantee for this strategy under the stated batch sampler was computed"
    rel = NEIGHBOURING_WORDS.get(str(report.get("neighbouring")), str(report.get("neighbouring")))
    return (f"report: epsilon <= {pessimistic(float(eps))} (delta = {float(report['delta']):g}, "
            f"{report['setting']}, {sampler_words(report.get('batching'), report.get('sampling'))}, "
            f"{report.get('participation')}, {rel})")


def report_notes(report: dict) -> list[str]:
    """The lines after the report line: the guarantee rows compared, rows of other batch samplers
    that certify less for the same strategy, and the reference rows (another mechanism)."""
    out = []
    cands = report.get("candidates") or {}
    if len(cands) > 1:
        out.append("  smallest of the guarantees for this sampler: "
                   + ", ".join(f"{k} {pessimistic(float(v))}" for k, v in cands.items()))
    for o in report.get("other_samplers") or []:
        sampler = ("no sampling, each example in at most one step" if o["batch_sampler"] == "deterministic"
                   else o["batch_sampler"])
        out.append(f"  another batch sampler would certify less for this strategy: {o['setting']} "
                   f"({sampler}): epsilon <= {pessimistic(float(o['epsilon']))}")
    refs = report.get("references") or {}
    if refs:
        out.append("  references, another mechanism (DP-SGD, C = I, at the same sigma), not this strategy's privacy: "
                   + ", ".join(f"{k} {pessimistic(float(v))}" for k, v in refs.items()))
    return out
