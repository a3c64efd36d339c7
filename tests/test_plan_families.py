"""``services.plan``'s one table of candidate families (issue 23): every kind plan offers has one
``PlanFamily``, and the plan code asks it instead of testing the kind's name. The fields that steer
the accounting and the artifact are checked here against what actually runs, computed another way:
the accounting each balls-in-bins row is calibrated under, and the structured strategy --out
writes (its kind and whether its C is exactly the identity, ``is_identity``, which decides whether
DP-SGD's accounting holds for it)."""
from __future__ import annotations

import numpy as np
import pytest

from mfcli.errors import MfcliError
from mfcli.services.plan import (
    FAMILIES,
    SAMPLERS,
    CandidateResult,
    TrainingSetup,
    _structured_strategy,
    enumerate_candidates,
    evaluate,
    family,
)

# n = 2 epochs x 4 steps = 8 (4 leaves: the tree's own balls-in-bins bound applies): every kind is cheap
SETUP = TrainingSetup(examples=400, batch=100, epsilon=4.0, epochs=2, delta=1e-5, bands=(2,), buffers=(2,),
                      batching=SAMPLERS)


@pytest.fixture(scope="module")
def offered():
    cands, skipped = enumerate_candidates(SETUP)
    return cands, skipped


def test_every_family_is_offered_and_every_offered_kind_has_a_family(offered) -> None:
    cands, skipped = offered
    assert {c.kind for c in cands} == set(FAMILIES)
    assert all(x.key.split(" ")[0].rsplit("-", 1)[0] in FAMILIES or x.key.split(" ")[0] in FAMILIES for x in skipped)


def test_an_unknown_kind_is_refused_naming_the_families() -> None:
    with pytest.raises(MfcliError, match=r"unknown candidate kind 'nope'.*dp-sgd.*honaker"):
        family("nope")


def test_balls_in_bins_rows_use_the_bound_their_family_says(offered) -> None:
    """A family with a balls-in-bins bound of its own (DP-SGD: C = I; the tree on 2^L leaves) is
    calibrated under it; every other family's balls-in-bins row is the DP-SGD reduction."""
    cands, _ = offered
    bib = [c for c in cands if c.sampler == "balls-in-bins"]
    assert {c.kind for c in bib} == set(FAMILIES)  # every family has a balls-in-bins row here
    for c in bib:
        r = evaluate(SETUP, c)
        assert isinstance(r, CandidateResult), r
        own = {"balls-in-bins-dp-sgd", "balls-in-bins-tree"}
        names = {a for a, _ in r.guarantees}
        if family(c.kind).own_balls_in_bins:
            assert names & own, (c.key, names)
        else:
            assert names == {"dp-sgd-reduction"}, (c.key, names)
        assert r.reduction_row is not family(c.kind).own_balls_in_bins


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_the_structured_form_out_writes(offered, kind: str) -> None:
    """--out's structured strategy: the family's artifact kind, and C exactly I only for DP-SGD
    (checked on the dense C materialised from its first column, entry by entry)."""
    cands, _ = offered
    fam = family(kind)
    cand = next(c for c in cands if c.kind == kind and c.sampler != "balls-in-bins")
    r = evaluate(SETUP, cand)
    assert isinstance(r, CandidateResult)
    if fam.structured_strategy is None:
        with pytest.raises(MfcliError, match="no structured form"):
            _structured_strategy(SETUP, r)
        return
    st = _structured_strategy(SETUP, r)
    assert st.kind == fam.artifact_kind
    n = SETUP.n
    col = np.asarray(st.strategy_coefs(n))
    dense = np.array([[col[i - j] if i >= j else 0.0 for j in range(n)] for i in range(n)])
    assert bool(np.array_equal(dense, np.eye(n))) is fam.identity
    assert st.is_identity(n) is fam.identity
