"""``events.event_to_json`` / ``event_from_json``: the JSON written for dp-accounting events, against
hand-written expected text, and the round trip (numpy values included)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from dp_accounting import dp_event

from mfcli.accounting.events import event_from_json, event_to_json

CASES = [
    (dp_event.SelfComposedDpEvent(dp_event.MixtureOfGaussiansDpEvent(1.5, [0.0, 0.25], [0.5, 0.5]), 3),
     {"class_name": "SelfComposedDpEvent", "event": {"class_name": "MixtureOfGaussiansDpEvent",
      "standard_deviation": 1.5, "sensitivities": [0.0, 0.25], "sampling_probs": [0.5, 0.5]}, "count": 3}),
    # numpy scalars and arrays are written as plain numbers, an int list stays ints
    (dp_event.MixtureOfGaussiansDpEvent(np.float64(2.0), np.array([0.1, 1 / 3]), [np.float64(0.25), 0.75]),
     {"class_name": "MixtureOfGaussiansDpEvent", "standard_deviation": 2.0, "sensitivities": [0.1, 1 / 3],
      "sampling_probs": [0.25, 0.75]}),
    (dp_event.ComposedDpEvent([dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(4.0)),
                               dp_event.MixtureOfGaussiansDpEvent(1.0, [1, 2], [0.5, 0.5])]),
     {"class_name": "ComposedDpEvent", "events": [
         {"class_name": "PoissonSampledDpEvent", "sampling_probability": 0.01,
          "event": {"class_name": "GaussianDpEvent", "noise_multiplier": 4.0}},
         {"class_name": "MixtureOfGaussiansDpEvent", "standard_deviation": 1.0, "sensitivities": [1, 2],
          "sampling_probs": [0.5, 0.5]}]}),
]


@pytest.mark.parametrize(("event", "expected"), CASES)
def test_event_json_is_the_fields_in_full_precision(event: object, expected: dict) -> None:
    text = event_to_json(event)
    assert text == json.dumps(expected, separators=(",", ":"))
    back = event_from_json(text)
    assert event_to_json(back) == text


def _named_tuple_plain(obj: object) -> object:
    """The oracle: dp-accounting's own ``to_named_tuple`` (what event_to_json read before it took
    the attrs fields directly), module_name dropped, numpy values as plain numbers."""
    if hasattr(obj, "to_named_tuple"):
        obj = obj.to_named_tuple()
    if hasattr(obj, "_asdict"):
        d = obj._asdict()
        d.pop("module_name", None)
        return {k: _named_tuple_plain(v) for k, v in d.items()}
    if isinstance(obj, (list, tuple)):
        return [_named_tuple_plain(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [_named_tuple_plain(v) for v in obj.tolist()]
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    return obj


def _every_event_kind() -> list:
    g = dp_event.GaussianDpEvent(np.float64(1.25))
    mog = dp_event.MixtureOfGaussiansDpEvent(0.7, np.array([0.0, 0.02, 1 / 3]), [0.25, np.float64(0.5), 0.25])
    return [
        dp_event.NoOpDpEvent(), dp_event.NonPrivateDpEvent(), dp_event.UnsupportedDpEvent(),
        dp_event.RandomizedResponseDpEvent(0.5, 4), g, dp_event.LaplaceDpEvent(2.0),
        dp_event.DiscreteLaplaceDpEvent(0.5, 3), dp_event.SelfComposedDpEvent(g, 7),
        dp_event.ComposedDpEvent([g, mog, dp_event.ComposedDpEvent([])]),
        dp_event.PoissonSampledDpEvent(0.01, g), dp_event.SampledWithReplacementDpEvent(100, 10, mog),
        dp_event.SampledWithoutReplacementDpEvent(100, 10, g),
        dp_event.SingleEpochTreeAggregationDpEvent(1.5, [4, 8]),
        dp_event.RepeatAndSelectDpEvent(g, 3.0, 1.0), mog, dp_event.ZCDpEvent(0.1, 0.0),
        dp_event.TruncatedSubsampledGaussianDpEvent(1000, 0.05, 2, 1.2),
        dp_event.SelfComposedDpEvent(dp_event.ComposedDpEvent([mog, dp_event.SelfComposedDpEvent(mog, 2)]), 5),
    ]


@pytest.mark.parametrize("event", _every_event_kind(), ids=lambda e: type(e).__name__)
def test_event_json_equals_dp_accountings_named_tuple_form(event: object) -> None:
    """The JSON is read from the attrs fields directly (fast); it must be exactly what dp-accounting's
    own ``to_named_tuple`` gives, for every event class, nested and with numpy values."""
    assert event_to_json(event) == json.dumps(_named_tuple_plain(event), separators=(",", ":"))


def test_mmcc_event_json_equals_named_tuple_form() -> None:
    """The large event of the headline (MMCC on a small dense C: one mixture per distinct row)."""
    from mfcli.accounting.mmcc import mmcc

    c = np.tril(np.ones((12, 12))) / np.sqrt(np.arange(12, 0, -1))[None, :]
    res = mmcc(c, sigma=1.0, sampling=0.1, value_discretization=1e-3)
    ev = res.dp_event()
    assert len(ev.events) == res.distinct_rows > 1
    assert event_to_json(ev) == json.dumps(_named_tuple_plain(ev), separators=(",", ":"))
    assert res.as_dict()["dp_event"] == event_to_json(ev)
