"""Default accounting parameters and the names of the settings, in a module that imports only the
name registry :mod:`mfcli.model.kinds` (data).

``mfcli account --help`` shows these defaults; keeping them here (not in :mod:`single_pass`,
:mod:`mmcc` or :mod:`session`, which import scipy.stats and dp-accounting) lets the help render
without loading the accounting stack (docs/performance.md, "Start-up time"). The modules that use
a default import it from here, so each value is defined once.
"""
from __future__ import annotations

from mfcli.model.kinds import ACCOUNTABLE

#: delta used unless asked otherwise.
DEFAULT_DELTA = 1e-6
#: PLD value discretization used unless asked otherwise (dp-accounting's default).
DEFAULT_DISCRETIZATION = 1e-4
#: Default rounding grid of the row mixtures' sensitivities (docs/accounting.md, "Algorithm", step 3): 1/50 = 0.02.
DEFAULT_MIXTURE_RESOLUTION = 50
#: Default share of delta spent on the tail events.
DEFAULT_TAIL_FRACTION = 0.5
#: The shipped artifact accounted when no strategy is given.
DEFAULT_ARTIFACT = "momentum-n256"
#: The accounting settings, in display order.
SETTINGS = ("single-pass", "deterministic", "dp-sgd", "mmcc", "cyclic-poisson", "shuffled-tree", "balls-in-bins-tree",
            "shuffled-dp-sgd", "dp-sgd-reduction", "balls-in-bins-dp-sgd")
#: Rows that account another mechanism (DP-SGD, C = I, at the same sigma): references, never this
#: strategy's privacy.
REFERENCE_SETTINGS = ("dp-sgd", "shuffled-dp-sgd", "balls-in-bins-dp-sgd")
#: Batch samplers (``--batching``). With a sampling rate: poisson (the default; every example in
#: every step with probability p: DP-SGD, MMCC) or cyclic (examples in b groups, group i mod b
#: Poisson-sampled at step i: banded C, 2306.08153). Without one: balls-in-bins (each example in
#: exactly one uniformly random step of the epoch) or shuffle (one shuffled epoch).
BATCHINGS = ("poisson", "cyclic", "balls-in-bins", "shuffle")
#: The batch samplers that take a sampling rate.
SAMPLED_BATCHINGS = ("poisson", "cyclic")
#: The settings shown for each batch sampler without a rate: every row names the sampler it
#: assumes, and a trainer who chose one sampler is never shown a number that assumes another.
BATCHING_SETTINGS = {
    "balls-in-bins": ("single-pass", "balls-in-bins-tree", "dp-sgd-reduction", "balls-in-bins-dp-sgd"),
    "shuffle": ("single-pass", "shuffled-tree", "shuffled-dp-sgd", "dp-sgd-reduction"),
}
#: The rows whose epsilon is a guarantee for the strategy under each batch sampler (None: no
#: sampling, deterministic participation): the reported number is the smallest of them.
GUARANTEE_SETTINGS = {
    # the shuffled tree's number is the single-epoch Gaussian bound, valid for any order of the
    # data (accounting/shuffled_tree.py): a guarantee without a sampler too, where it is computed
    # (one participation; it equals single-pass there, which stays first among ties)
    None: ("single-pass", "deterministic", "shuffled-tree"),
    "poisson": ("mmcc", "dp-sgd-reduction"),
    "cyclic": ("single-pass", "cyclic-poisson", "dp-sgd-reduction"),
    "balls-in-bins": ("single-pass", "balls-in-bins-tree", "dp-sgd-reduction"),
    # the reduction under shuffle inherits the shuffled DP-SGD bound's batch size 1 (N = n), which
    # account cannot check, so it is shown but not a candidate for the reported number
    "shuffle": ("single-pass", "shuffled-tree"),
}
#: Built-in strategies ``account`` can build for a workload (the registry's accountable baselines).
BUILTIN = ACCOUNTABLE

__all__ = [
    "BATCHINGS",
    "BATCHING_SETTINGS",
    "BUILTIN",
    "DEFAULT_ARTIFACT",
    "DEFAULT_DELTA",
    "DEFAULT_DISCRETIZATION",
    "DEFAULT_MIXTURE_RESOLUTION",
    "DEFAULT_TAIL_FRACTION",
    "GUARANTEE_SETTINGS",
    "REFERENCE_SETTINGS",
    "SAMPLED_BATCHINGS",
    "SETTINGS",
]
