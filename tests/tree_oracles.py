"""Dense twin of plan's tree and Honaker rows (not a test module): the tree restarted every epoch
built from the baselines' dense matrices, the second method the plan tests compare
:class:`mfcli.strategies.baseline_mechanisms.TreeEncoderMechanism` (``epochs`` > 1) against."""
from __future__ import annotations

from typing import Any

import numpy as np

from mfcli.strategies.baselines import honaker_online_decoder, tree_decoder, tree_nodes, tree_strategy_matrix

#: plan's tree kinds and the prefix decoder of each (the Honaker row is the online estimator).
DECODERS = {"tree": tree_decoder, "honaker": honaker_online_decoder}


def restarted_tree(setup: Any, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(C_e, M_e, release) of a tree on s = ``setup.steps_per_epoch`` leaves restarted every epoch,
    as dense matrices: C_e the tree encoder (m x s, 0/1), M_e = S^-1 B_e the gradient estimate from
    its nodes (s x m; B_e the tree's or Honaker's online prefix decoder), release the step of each
    node. The run's C is blockdiag(C_e) over the epochs and B = A blockdiag(M_e)."""
    s = setup.steps_per_epoch
    b = DECODERS[kind](s)
    m = np.vstack([b[:1], np.diff(b, axis=0)])  # S^-1 B: the gradient estimates
    return tree_strategy_matrix(s), m, np.asarray(tree_nodes(s).end)
