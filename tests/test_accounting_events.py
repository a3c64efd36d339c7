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
