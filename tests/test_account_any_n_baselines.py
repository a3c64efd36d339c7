"""`mfcli account --strategy identity|tree|sqrt --n N` above the dense limit: the baseline's form of
any n (no matrix) gives the settings that need only its sensitivity, checked against the Gaussian
mechanism's delta in closed form; just below the limit the matrix path and the form of any n agree."""
from __future__ import annotations

import json
import math

import pytest
from accounting_oracles import gaussian_delta
from typer.testing import CliRunner

from mfcli.cli.app import app
from mfcli.model.participation import FixedEpoch, SingleParticipation
from mfcli.services.account import _any_n_baseline, account, resolve_strategy

SIGMA = 4.0
DELTA = 1e-6
runner = CliRunner()


def run(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def _exact_sensitivity(strategy: str, n: int, epochs: int) -> float:
    """Independent closed forms: identity 1 in every schema (sqrt(epochs) columns of unit norm);
    the 0/1 tree over n = 2^k leaves, one epoch: every leaf lies in k + 1 nodes."""
    if strategy == "identity":
        return math.sqrt(epochs)
    assert strategy == "tree" and epochs == 1 and n & (n - 1) == 0
    return math.sqrt(n.bit_length())  # k + 1 levels for n = 2^k


@pytest.mark.parametrize("strategy, n, epochs", [("identity", 100_000, 1), ("identity", 100_000, 4),
                                                 ("tree", 2**16, 1)])
def test_cli_epsilon_above_the_dense_limit_is_the_gaussian_mechanisms(strategy: str, n: int, epochs: int) -> None:
    args = ["account", "--strategy", strategy, "--n", n, "--sigma", SIGMA, "--json"]
    if epochs > 1:
        args += ["--epochs", epochs]
    r = run(*args)
    assert r.exit_code == 0, r.output
    eps = json.loads(r.stdout)["report"]["epsilon"]
    mu = _exact_sensitivity(strategy, n, epochs) / SIGMA
    assert gaussian_delta(eps, mu) <= DELTA * (1 + 1e-6)  # an upper bound on epsilon ...
    assert gaussian_delta(eps * (1 - 1e-4), mu) > DELTA  # ... and a tight one


@pytest.mark.parametrize("strategy", ["identity", "tree", "sqrt"])
@pytest.mark.parametrize("schema", [SingleParticipation(), FixedEpoch(epochs=4)])
def test_the_form_of_any_n_accounts_like_the_matrix_below_the_limit(strategy: str, schema: object) -> None:
    n = 1024
    setting = "single-pass" if isinstance(schema, SingleParticipation) else "deterministic"
    dense = resolve_strategy(strategy=strategy, n=n)
    any_n = _any_n_baseline(strategy, n=n, workload="prefix", beta=0.9)
    assert any_n.strategy.size == 0 and dense.strategy.size > 0
    eps = [account(inp, sigma=SIGMA, sampling=None, participation=schema, settings=[setting]).rows[setting]["epsilon"]
           for inp in (dense, any_n)]
    assert eps[1] == pytest.approx(eps[0], rel=1e-9)


def test_sampled_settings_that_need_the_matrix_say_so_above_the_limit() -> None:
    r = run("account", "--strategy", "tree", "--n", 2**16, "--sigma", SIGMA, "--sampling", 0.01)
    assert r.exit_code == 0, r.output
    assert "MMCC: not run" in r.output and "8192" in r.output


def test_the_shuffled_tree_calibrates_above_the_limit_as_it_is_shown() -> None:
    """The shuffled tree needs only n and the 0/1 tree's sigma: shown with --sigma above the dense
    limit, it calibrates there too, and the sigma found meets the target by the row's own setting."""
    from mfcli.accounting.shuffled_tree import shuffled_tree

    n = 2**16
    r = run("account", "--strategy", "tree", "--n", n, "--epsilon", 4, "--setting", "shuffled-tree", "--json")
    assert r.exit_code == 0, r.output
    cal = json.loads(r.stdout)["calibration"]
    assert cal["achieved_epsilon"] <= 4.0
    assert shuffled_tree(n=n, sigma=cal["sigma"], delta=DELTA).epsilon <= 4.0
    assert shuffled_tree(n=n, sigma=cal["sigma_bracket"][0] * (1 - 1e-3), delta=DELTA).epsilon > 4.0
