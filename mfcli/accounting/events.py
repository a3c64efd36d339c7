"""dp-accounting events as JSON, both ways (stored in artifacts by ``mfcli account --write``)."""
from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from mfcli.errors import MfcliError


def _to_plain(obj: Any) -> Any:
    fields = getattr(type(obj), "__attrs_attrs__", None)
    if fields is not None and hasattr(obj, "to_named_tuple"):
        # what ``to_named_tuple`` gives, less its module_name, read from the attrs fields directly:
        # to_named_tuple builds a NamedTuple class per event and walks every element of every list
        # (a mixture's sensitivities), about 0.3 s for the headline MMCC event of 256 rows
        return {"class_name": type(obj).__name__, **{f.name: _plain_field(getattr(obj, f.name)) for f in fields}}
    if hasattr(obj, "_asdict"):
        d = obj._asdict()
        d.pop("module_name", None)
        return {k: _to_plain(v) for k, v in d.items()}
    if isinstance(obj, (list, tuple)):
        if all(type(v) is float or type(v) is int for v in obj):  # the bulk of a mixture's event
            return list(obj)
        return [_to_plain(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _to_plain(obj.tolist())
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    return obj


def _plain_field(value: Any) -> Any:
    """One field of an event, as :func:`_to_plain` of its ``to_named_tuple`` form: a mapping
    field keeps that form (its values as named tuples), the rest is :func:`_to_plain` itself."""
    if isinstance(value, Mapping):
        return {k: v.to_named_tuple() if hasattr(type(v), "__attrs_attrs__") else v for k, v in value.items()}
    return _to_plain(value)


def event_to_json(event: Any) -> str:
    """Compact JSON of a ``dp_accounting.dp_event.DpEvent``: nested objects with ``class_name``
    and the event's own fields (floats written with full precision)."""
    return json.dumps(_to_plain(event), separators=(",", ":"))


def poisson_gaussian_event(sampling: float, noise_multiplier: float, steps: int) -> Any:
    """``steps`` self-composed Poisson-sampled Gaussians (rate ``sampling``, noise multiplier
    ``noise_multiplier``): DP-SGD's event, and that of every row accounted as a DP-SGD (the
    cyclic-Poisson reduction, each group of the per-step reduction)."""
    from dp_accounting import dp_event

    return dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(sampling, dp_event.GaussianDpEvent(noise_multiplier)), steps)


# The same JSON built from plain values, without importing dp-accounting (which loads scipy.signal
# and scipy.stats, about 1 s of CPU): each function gives what :func:`_to_plain` gives for the event
# named, field for field in the event's own field order (tests/test_accounting_events_plain.py
# holds them equal to :func:`event_to_json` of dp-accounting's events).


def plain_json(plain: Mapping[str, Any]) -> str:
    """Compact JSON of an event built by the ``plain_*`` functions (:func:`event_to_json`'s format)."""
    return json.dumps(plain, separators=(",", ":"))


def plain_gaussian(noise_multiplier: float) -> dict[str, Any]:
    """``GaussianDpEvent(noise_multiplier)`` as plain values."""
    return {"class_name": "GaussianDpEvent", "noise_multiplier": noise_multiplier}


def plain_poisson_gaussian(sampling: float, noise_multiplier: float, steps: int) -> dict[str, Any]:
    """:func:`poisson_gaussian_event` as plain values."""
    return {"class_name": "SelfComposedDpEvent",
            "event": {"class_name": "PoissonSampledDpEvent", "sampling_probability": sampling,
                      "event": plain_gaussian(noise_multiplier)},
            "count": steps}


def plain_mixture_rows(standard_deviation: float,
                       rows: list[tuple[list[float], list[float], int]]) -> dict[str, Any]:
    """``ComposedDpEvent`` of one ``SelfComposedDpEvent(MixtureOfGaussiansDpEvent(standard_deviation,
    sensitivities, probabilities), count)`` per (sensitivities, probabilities, count) in ``rows``
    (lists of Python floats), as plain values."""
    return plain_composed([
        {"class_name": "SelfComposedDpEvent",
         "event": {"class_name": "MixtureOfGaussiansDpEvent", "standard_deviation": standard_deviation,
                   "sensitivities": sens, "sampling_probs": probs},
         "count": count}
        for sens, probs, count in rows])


def plain_composed(events: list[dict[str, Any]]) -> dict[str, Any]:
    """``ComposedDpEvent(events)`` of events given as plain values."""
    return {"class_name": "ComposedDpEvent", "events": events}


def event_from_json(text: str) -> Any:
    """Rebuild the ``DpEvent`` written by :func:`event_to_json`."""
    from dp_accounting import dp_event

    def build(obj: Any) -> Any:
        if isinstance(obj, dict) and "class_name" in obj:
            cls = getattr(dp_event, obj["class_name"], None)
            if cls is None:
                raise MfcliError(f"unknown dp-accounting event class {obj['class_name']!r}")
            return cls(**{k: build(v) for k, v in obj.items() if k != "class_name"})
        if isinstance(obj, list):
            return [build(v) for v in obj]
        return obj

    try:
        return build(json.loads(text))
    except (ValueError, TypeError) as exc:
        raise MfcliError(f"cannot read the stored dp-accounting event: {exc}") from None
