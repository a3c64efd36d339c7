"""The one registry of strategy kinds and their names (issue 23): every list of names a command
accepts or shows is read from :data:`KINDS`, so a new family is one entry here.

A kind is one way of writing a mechanism A = B C down:

* ``baseline``: a classical strategy built for a workload (identity, the binary tree and its
  Honaker estimators, the square root) and ``optimal`` (the certified dense solution);
  ``compare`` shows them, ``compare --save-strategy`` writes them, and those with
  ``accountable`` are what ``account --strategy`` builds;
* ``structured``: a strategy stored as its parameters (banded Toeplitz, BLT), of any n, written
  by ``optimize --strategy`` and :func:`mfcli.io.artifact.save_structured_artifact`;
* ``operator``: the operators of a dense artifact (its dense root and a ``compressed`` group).

Every kind is accounted, inspected, compared and streamed through the one protocol
:class:`mfcli.strategies.operators.Mechanism`. This module is data only (layer 1): the classes implementing a
kind live with their family (:func:`mfcli.strategies.structured.strategy_class` maps a structured kind to
its class by the class's own ``kind`` attribute).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    """One kind of strategy.

    Attributes:
        name: the name commands, artifacts and records use.
        family: ``baseline``, ``structured`` or ``operator`` (module docstring).
        description: one line, as ``compare`` prints it.
        accountable: ``account --strategy`` builds it for a workload of n steps.
        tree: built on the binary tree (m = 2n' - 1 rows at most, a non-square C).
        any_n: a mechanism of any n without n x n matrices
            (:func:`mfcli.strategies.baseline_mechanisms.baseline_mechanism`): ``compare`` lists it
            above the dense limit.
        solved: built by a certified solver, not in closed form (seconds to minutes; a stored
            artifact of it can stand in for the solve: ``compare --artifact``).
    """

    name: str
    family: str
    description: str
    accountable: bool = False
    tree: bool = False
    any_n: bool = False
    solved: bool = False


KINDS: tuple[Kind, ...] = (
    Kind("identity", "baseline", "C = I, B = A: independent noise in every step (DP-SGD)", accountable=True,
         any_n=True),
    Kind("tree", "baseline", "binary tree; each prefix sum from its minimal dyadic decomposition",
         accountable=True, tree=True, any_n=True),
    Kind("honaker-online", "baseline",
         "binary tree; min-norm estimate over the nodes closed so far (streaming Honaker)", tree=True, any_n=True),
    Kind("honaker-full", "baseline", "binary tree; B = S C^+ over all nodes (offline Honaker, not causal)",
         tree=True, any_n=True),
    Kind("sqrt", "baseline", "C = S^1/2, lower-triangular Toeplitz, coefficients binom(2k,k)/4^k", accountable=True,
         any_n=True),
    Kind("optimal", "baseline", "optimal lower-triangular factorization, certified by a duality gap",
         accountable=True, solved=True),
    Kind("banded-toeplitz", "structured", "banded Toeplitz C, stored as its b coefficients"),
    Kind("blt", "structured", "buffered linear Toeplitz C, stored as its buffers' theta and omega"),
    Kind("dense", "operator", "the dense root of an artifact: strategy C, decoder B"),
    Kind("compressed", "operator", "a banded plus low-rank decoder B^ and C^ = B^-1 A"),
)


def names(family: str, *, accountable: bool | None = None, tree: bool | None = None,
          any_n: bool | None = None) -> tuple[str, ...]:
    """The names of one family, in registry order (optionally only the accountable, tree or
    any-n ones)."""
    return tuple(k.name for k in KINDS if k.family == family
                 and (accountable is None or k.accountable == accountable) and (tree is None or k.tree == tree)
                 and (any_n is None or k.any_n == any_n))


#: ``compare``'s baseline rows, ``compare --strategies`` and ``--save-strategy``.
BASELINES = names("baseline")
#: The baselines ``account --strategy`` builds.
ACCOUNTABLE = names("baseline", accountable=True)
#: The baselines built on the binary tree.
TREE_BASELINES = names("baseline", tree=True)
#: The baselines with a mechanism of any n (``compare`` above the dense limit).
ANY_N_BASELINES = names("baseline", any_n=True)
#: The kinds stored as parameters (``optimize --strategy`` besides ``optimal``).
STRUCTURED = names("structured")
#: The baselines a certified solver builds (``compare --artifact`` rows stand for them).
SOLVED = tuple(k.name for k in KINDS if k.family == "baseline" and k.solved)
#: {name: description} of every kind.
DESCRIPTIONS = {k.name: k.description for k in KINDS}

__all__ = ["ACCOUNTABLE", "ANY_N_BASELINES", "BASELINES", "DESCRIPTIONS", "KINDS", "SOLVED", "STRUCTURED",
           "TREE_BASELINES", "Kind", "names"]
