"""Multi-epoch private training at equal epsilon: an example, not part of the library.

The multi-epoch counterpart of :mod:`study` (same data, model, trainer and learning-rate search):
K epochs over the N training examples in n steps, expected batch size B = N K / n, and six arms,
each trained with the batch sampler its accounting assumes and calibrated by mfcli's library to
the same (epsilon, delta):

* ``dp-sgd`` / ``dp-sgd-momentum-cooldown``: identity strategy (no correlation) for the SGD or
  the momentum + cooldown workload; **Poisson** sampling at rate q = B / N every step; accounted by
  :func:`mfcli.accounting.single_pass.dpsgd` (dp-accounting PLD, n Poisson-sampled Gaussians).
* ``bandmf`` / ``bandmf-momentum-cooldown``: BandMF (:func:`mfcli.optimize.multi_solver.multi_participation_factorization`
  with :class:`~mfcli.model.participation.MinSeparation` b, C b-banded, unit column norms); **cyclic
  Poisson** sampling: the examples are split into b groups at random once, at step i group i mod b
  is Poisson-sampled at rate p = B b / N; accounted by :func:`mfcli.accounting.multi.cyclic_poisson`
  (2306.08153 Thm. 3: DP-SGD with ceil(n / b) steps at rate p).
* ``dense`` / ``dense-momentum-cooldown``: the dense multi-epoch optimum for
  :class:`~mfcli.model.participation.FixedEpoch` K (X = C^T C orthogonal across epochs, sensitivity 1);
  **fixed epoch order**: one random permutation cut into n / K batches of B, batch i mod (n / K) at
  step i, so an example takes part in steps j, j + n / K, ... exactly the schema's patterns;
  accounted by :func:`mfcli.accounting.multi.deterministic` (the Gaussian at the schema sensitivity).

Every sampler divides the noisy gradient sum by the expected batch size B (the Poisson samplers'
batches vary in size). Smoothing is not studied here.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from study import (
    Dataset,
    MechanismSpec,
    PreparedMechanism,
    RunResult,
    SoftmaxRegression,
    gradient_noise,
    load_mnist5k,
    run_optimizer,
    search_learning_rate,
    seed_streams,
)

from mfcli.accounting.calibrate import calibrate_sigma
from mfcli.accounting.multi import check_cyclic, cyclic_poisson, deterministic
from mfcli.accounting.single_pass import dpsgd
from mfcli.errors import MfcliError
from mfcli.model.participation import FixedEpoch, MinSeparation, Participation, sensitivity
from mfcli.model.workloads import build_workload, learning_rates, momentum_workload
from mfcli.optimize.multi_solver import multi_participation_factorization
from mfcli.strategies.baselines import Strategy, build_strategy

SAMPLERS = ("poisson", "cyclic-poisson", "fixed-epoch")


@dataclass(frozen=True)
class ArmSpec:
    """One arm: a strategy family, the optimizer it factorises and the sampler its accounting assumes."""

    key: str
    label: str
    family: str  # identity | bandmf | dense
    sampler: str  # one of SAMPLERS
    workload: str  # prefix | momentum
    beta: float = 0.0
    schedule: str = "constant"


def _arms() -> tuple[ArmSpec, ...]:
    out = []
    for family, sampler, name in (("identity", "poisson", "DP-SGD"), ("bandmf", "cyclic-poisson", "BandMF"),
                                  ("dense", "fixed-epoch", "Dense multi-epoch optimal")):
        key = "dp-sgd" if family == "identity" else family
        out.append(ArmSpec(key, name, family, sampler, "prefix"))
        out.append(ArmSpec(f"{key}-momentum-cooldown", f"{name}, momentum + cooldown", family, sampler, "momentum",
                           beta=0.9, schedule="cooldown"))
    return tuple(out)


ARMS: tuple[ArmSpec, ...] = _arms()
ARM_KEYS = tuple(a.key for a in ARMS)


def arm_spec(key: str) -> ArmSpec:
    for a in ARMS:
        if a.key == key:
            return a
    raise MfcliError(f"unknown arm {key!r}; choose from {', '.join(ARM_KEYS)}")


@dataclass(frozen=True)
class MultiEpochConfig:
    """Everything that determines the multi-epoch study's numbers.

    Attributes:
        n: total steps; epochs must divide n and n / epochs must divide the training set.
        epochs: K, the passes over the data (exact for fixed-epoch, in expectation for the Poisson samplers).
        bands: b of BandMF (its cyclic sampler has b groups); b must divide N and B b <= N.
        epsilons, delta: the privacy targets.
        arms: keys from :data:`ARM_KEYS`.
        lrs, tune_seeds, seeds, clip, pool: as :class:`study.StudyConfig`.
    """

    n: int = 200
    epochs: int = 10
    bands: int = 4
    epsilons: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
    delta: float = 1e-5
    arms: tuple[str, ...] = ARM_KEYS
    lrs: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)
    tune_seeds: tuple[int, ...] = (1001, 1002)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    clip: float = 1.0
    pool: int = 2
    tol: float = 1e-5

    def as_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class Geometry:
    """Batch sizes and rates derived from (N, n, K, b)."""

    n_examples: int
    n: int
    epochs: int
    bands: int

    @property
    def steps_per_epoch(self) -> int:
        return self.n // self.epochs

    @property
    def batch(self) -> int:
        """B = N K / n: the fixed batch of the epoch order, the expected batch of the Poisson samplers."""
        return self.n_examples // self.steps_per_epoch

    @property
    def poisson_rate(self) -> float:
        """q = B / N: every example K times in expectation over n steps."""
        return self.batch / self.n_examples

    @property
    def cyclic_rate(self) -> float:
        """p = B b / N: group size N / b sampled at rate p gives B in expectation, K participations
        per example in expectation over n steps (n / b visits to its group)."""
        return self.batch * self.bands / self.n_examples

    def check(self) -> None:
        if self.n % self.epochs:
            raise MfcliError(f"epochs = {self.epochs} must divide the number of steps n = {self.n}")
        if self.n_examples % self.steps_per_epoch:
            raise MfcliError(f"the {self.n_examples} training examples do not split into {self.steps_per_epoch} "
                             "equal batches per epoch")
        if self.n_examples % self.bands or self.n % self.bands:
            raise MfcliError(f"bands = {self.bands} must divide n = {self.n} and the training set")
        if not 0 < self.cyclic_rate <= 1:
            raise MfcliError(f"bands = {self.bands} gives a cyclic sampling rate {self.cyclic_rate:g} outside (0, 1]")


# ---------------------------------------------------------------------------------------------
# Batch samplers: each one is exactly what its arm's accounting assumes


def poisson_batches(n_examples: int, n: int, rate: float, rng: np.random.Generator) -> list[np.ndarray]:
    """Every example independently with probability ``rate`` at every step."""
    return [np.flatnonzero(rng.random(n_examples) < rate) for _ in range(n)]


def cyclic_poisson_batches(n_examples: int, n: int, bands: int, rate: float, rng: np.random.Generator) -> list[np.ndarray]:
    """The examples split at random into ``bands`` groups once; at step i group i mod b, each
    member independently with probability ``rate`` (2306.08153 Alg. 2)."""
    groups = rng.permutation(n_examples).reshape(bands, n_examples // bands)
    return [np.sort(groups[i % bands][rng.random(groups.shape[1]) < rate]) for i in range(n)]


def fixed_epoch_batches(n_examples: int, n: int, epochs: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One permutation cut into n / K batches, batch i mod (n / K) at step i: an example takes part
    in steps j, j + n / K, ..., j + (K - 1) n / K (the fixed-epoch schema's pattern j)."""
    per = n // epochs
    cut = rng.permutation(n_examples).reshape(per, n_examples // per)
    return [cut[i % per] for i in range(n)]


def sample_batches(arm: ArmSpec, geo: Geometry, rng: np.random.Generator) -> list[np.ndarray]:
    if arm.sampler == "poisson":
        return poisson_batches(geo.n_examples, geo.n, geo.poisson_rate, rng)
    if arm.sampler == "cyclic-poisson":
        return cyclic_poisson_batches(geo.n_examples, geo.n, geo.bands, geo.cyclic_rate, rng)
    return fixed_epoch_batches(geo.n_examples, geo.n, geo.epochs, rng)


# ---------------------------------------------------------------------------------------------
# Mechanisms and their calibration


@dataclass(frozen=True, eq=False)
class Arm:
    """A prepared arm: the mechanism the trainer runs and the schema its accounting uses."""

    spec: ArmSpec
    mech: PreparedMechanism
    schema: Participation | None  # None for DP-SGD (Poisson sampling, no schema)
    gap: float | None  # solver certificate (relative duality gap), None for the identity

    @property
    def strategy_matrix(self) -> np.ndarray:
        return self.mech.strategy.factorization.strategy


def prepare_arm(spec: ArmSpec, geo: Geometry, *, tol: float = 1e-6) -> Arm:
    """Build the workload the trainer's optimizer computes and the arm's strategy for it."""
    n = geo.n
    wl = build_workload(spec.workload, n, beta=spec.beta if spec.workload == "momentum" else 0.9, lr=spec.schedule)
    eta = learning_rates(n, spec.schedule)
    if not np.linalg.norm(momentum_workload(n, beta=spec.beta, lr=eta).matrix - wl.matrix) <= 1e-12 * np.linalg.norm(wl.matrix):
        raise MfcliError(f"arm {spec.key}: the trainer's optimizer does not compute the workload")
    gap: float | None = None
    schema: Participation | None = None
    if spec.family == "identity":
        strat = build_strategy("identity", wl)
    else:
        schema = MinSeparation(separation=geo.bands) if spec.family == "bandmf" else FixedEpoch(epochs=geo.epochs)
        res = multi_participation_factorization(wl.matrix, schema, tol=tol)
        gap = res.gap
        strat = Strategy(name=f"{spec.family}-optimal", factorization=res.factorization, causal=True,
                         description=f"{res.structure} optimum for {schema.describe(n)}, gap {res.gap:.2e}")
    eta.setflags(write=False)
    mech = PreparedMechanism(MechanismSpec(spec.key, spec.label, strat.name, spec.workload, spec.beta, spec.schedule),
                             strat, spec.beta, eta)
    return Arm(spec, mech, schema, gap)


@dataclass(frozen=True)
class ArmCalibration:
    """The noise of one arm at one target, from mfcli's accounting for its sampler.

    Attributes:
        sigma: noise std per coordinate of Z in units of the clip norm (the trainer adds
            clip * sigma * C^-1 Z).
        epsilon_achieved: the accountant's epsilon at sigma (<= the target).
        accounting: which accounting (``dp-sgd poisson``, ``cyclic-poisson``, ``deterministic``).
        noise_multiplier: sigma per unit of the quantity the accounting is a function of (the
            column norm for the Poisson reductions, the schema sensitivity for deterministic).
        scale: that quantity (max column norm of C, or the schema sensitivity).
    """

    epsilon: float
    delta: float
    sigma: float
    epsilon_achieved: float
    accounting: str
    noise_multiplier: float
    scale: float


def calibrate_arm(
    arm: Arm, geo: Geometry, *, epsilon: float, delta: float,
    known: Mapping[tuple[float, str], ArmCalibration] | None = None,
) -> ArmCalibration:
    """The smallest sigma (relative 1e-3) meeting (epsilon, delta) under the arm's own accounting.

    ``known`` holds earlier calibrations (keyed (epsilon, arm key)); one of another arm with the same
    sampler, delta and scale is reused, since each accounting's epsilon depends on C only through
    that scale (after the arm's own conditions are checked): it saves minutes of PLD composition.
    """
    c = arm.strategy_matrix
    col = float(np.sqrt(np.max(np.sum(c * c, axis=0))))
    scale = col if arm.spec.sampler != "fixed-epoch" else sensitivity(c, arm.schema).value  # type: ignore[arg-type]
    if arm.spec.sampler == "cyclic-poisson":
        check_cyclic(c, geo.bands)
    for (e, key), cal in (known or {}).items():
        if (e == epsilon and cal.delta == delta and arm_spec(key).sampler == arm.spec.sampler
                and abs(cal.scale - scale) <= 1e-12 * scale):
            return ArmCalibration(epsilon, delta, cal.noise_multiplier * scale, cal.epsilon_achieved, cal.accounting,
                                  cal.noise_multiplier, scale)
    if arm.spec.sampler == "poisson":
        # identity C: one Poisson-sampled Gaussian per step at noise multiplier sigma / max column norm (1)
        col = float(np.sqrt(np.max(np.sum(c * c, axis=0))))
        cal = calibrate_sigma(lambda s: dpsgd(sigma=s / col, sampling=geo.poisson_rate, steps=geo.n,
                                              delta=delta).epsilon, target_epsilon=epsilon)
        return ArmCalibration(epsilon, delta, cal.sigma, cal.epsilon, "dp-sgd poisson", cal.sigma / col, col)
    assert arm.schema is not None
    if arm.spec.sampler == "cyclic-poisson":
        rate = geo.cyclic_rate
        cal = calibrate_sigma(lambda s: cyclic_poisson(c, schema=arm.schema, sigma=s, sampling=rate,
                                                       delta=delta).epsilon, target_epsilon=epsilon)
        col = cyclic_poisson(c, schema=arm.schema, sigma=cal.sigma, sampling=rate, delta=delta).column_norm
        return ArmCalibration(epsilon, delta, cal.sigma, cal.epsilon, "cyclic-poisson", cal.sigma / col, col)
    sens = sensitivity(c, arm.schema)
    cal = calibrate_sigma(lambda s: deterministic(sigma=s, sensitivity=sens, n=geo.n, delta=delta).epsilon,
                          target_epsilon=epsilon)
    return ArmCalibration(epsilon, delta, cal.sigma, cal.epsilon, "deterministic", cal.sigma / sens.value, sens.value)


# ---------------------------------------------------------------------------------------------
# Training


def train_arm_runs(
    *, data: Dataset, arm: Arm, geo: Geometry, sigma: float, lrs: Sequence[float], seeds: Sequence[int],
    clip: float, noise_for: Callable[[int], np.ndarray] | None = None,
) -> list[RunResult]:
    """Train len(seeds) runs (run r: lrs[r], seeds[r]) with the arm's sampler; sigma in clip units
    (0: non-private). A seed fixes the batches and the noise (independent child streams)."""
    model = SoftmaxRegression(data.n_features, data.n_classes)
    x, y = data.x_train, data.y_train
    per_run = [sample_batches(arm.spec, geo, seed_streams(s)[0]) for s in seeds]

    def grad(theta: np.ndarray, t: int) -> np.ndarray:
        out = np.zeros_like(theta)
        for r, batches in enumerate(per_run):
            idx = batches[t]
            if idx.size:
                out[r] = model.clipped_gradient_sum(theta[r], x[idx], y[idx], clip)
        return out

    noise = None
    if sigma > 0:
        get = noise_for or (lambda s: gradient_noise(arm.mech, d=model.d, sigma=1.0, noise_seed=seed_streams(s)[1]))
        noise = np.stack([get(s) for s in seeds], axis=1) * (sigma * clip)
    with np.errstate(over="ignore", invalid="ignore"):
        theta = run_optimizer(mech=arm.mech, gradient=grad, d=model.d, lr=np.asarray(lrs, dtype=np.float64),
                              batch_size=geo.batch, noise=noise, runs=len(seeds))
        va = model.evaluate_many(theta, data.x_val, data.y_val)
        te = model.evaluate_many(theta, data.x_test, data.y_test)
    return [RunResult(float(va[0][r]), float(va[1][r]), float(te[0][r]), float(te[1][r])) for r in range(len(seeds))]


@dataclass(frozen=True)
class MultiCell:
    arm: str
    label: str
    epsilon: float | None
    sigma: float
    accounting: str
    lr: float
    test_accuracy: tuple[float, ...]
    test_loss: tuple[float, ...]
    val_accuracy: float

    @property
    def acc_mean(self) -> float:
        return float(np.mean(self.test_accuracy))

    @property
    def acc_std(self) -> float:
        return float(np.std(self.test_accuracy, ddof=1)) if len(self.test_accuracy) > 1 else 0.0

    def as_dict(self) -> dict:
        return dict(self.__dict__, acc_mean=self.acc_mean, acc_std=self.acc_std)


@dataclass(frozen=True)
class MultiEpochResult:
    config: MultiEpochConfig
    geometry: Geometry
    dataset: Mapping[str, object]
    arms: Mapping[str, Mapping[str, object]]
    calibrations: Mapping[tuple[float, str], ArmCalibration]
    cells: tuple[MultiCell, ...]
    seconds: float
    runs: int

    def cell(self, arm: str, epsilon: float | None) -> MultiCell:
        for c in self.cells:
            if c.arm == arm and c.epsilon == epsilon:
                return c
        raise KeyError((arm, epsilon))


def run_multi_epoch(
    config: MultiEpochConfig, *, data: Dataset | None = None, progress: Callable[[str], None] | None = None,
) -> MultiEpochResult:
    """Every (arm, epsilon) cell plus the non-private ceilings (SGD and momentum + cooldown, fixed epoch order)."""
    t0 = time.perf_counter()
    say = progress or (lambda _m: None)
    for e in config.epsilons:
        if not (e > 0 and math.isfinite(e)):
            raise MfcliError(f"every epsilon must be positive and finite, got {e}")
    for k in config.arms:
        arm_spec(k)
    if data is None:
        data = load_mnist5k(pool=config.pool)
    geo = Geometry(int(data.x_train.shape[0]), config.n, config.epochs, config.bands)
    geo.check()
    d = SoftmaxRegression(data.n_features, data.n_classes).d
    arms: dict[str, Arm] = {}
    for key in config.arms:
        say(f"building {key} (n = {config.n}, {config.epochs} epochs, {config.bands} bands)")
        arms[key] = prepare_arm(arm_spec(key), geo, tol=config.tol)
    cache: dict[tuple[str, int], np.ndarray] = {}
    counter = [0]

    def unit(arm: Arm, s: int) -> np.ndarray:
        if (arm.spec.key, s) not in cache:
            cache[(arm.spec.key, s)] = gradient_noise(arm.mech, d=d, sigma=1.0, noise_seed=seed_streams(s)[1])
        return cache[(arm.spec.key, s)]

    def tune_and_run(arm: Arm, sigma: float) -> tuple[float, float, list[RunResult]]:
        def run(lrs: Sequence[float], seeds: Sequence[int]) -> list[RunResult]:
            counter[0] += len(seeds)
            return train_arm_runs(data=data, arm=arm, geo=geo, sigma=sigma, lrs=lrs, seeds=seeds, clip=config.clip,
                                  noise_for=lambda s: unit(arm, s))

        def score(lrs: Sequence[float]) -> list[float]:
            k = len(config.tune_seeds)
            res = run([lr for lr in lrs for _ in range(k)], [s for _ in lrs for s in config.tune_seeds])
            return [float(np.mean([r.val_accuracy for r in res[i * k:(i + 1) * k]])) for i in range(len(lrs))]

        lr, val = search_learning_rate(score, config.lrs)
        return lr, val, run([lr] * len(config.seeds), list(config.seeds))

    cells: list[MultiCell] = []
    for key, label in (("dense", "Non-private SGD"), ("dense-momentum-cooldown", "Non-private momentum + cooldown")):
        arm = arms.get(key) or prepare_arm(arm_spec(key), geo, tol=config.tol)
        lr, val, runs = tune_and_run(arm, 0.0)
        cells.append(MultiCell(f"nonprivate-{key}", label, None, 0.0, "none", lr, tuple(r.test_accuracy for r in runs),
                               tuple(r.test_loss for r in runs), val))
        say(f"{label}: test accuracy {cells[-1].acc_mean:.4f}")
    calibrations: dict[tuple[float, str], ArmCalibration] = {}
    for eps in config.epsilons:
        for key, arm in arms.items():
            cal = calibrate_arm(arm, geo, epsilon=eps, delta=config.delta, known=calibrations)
            calibrations[(eps, key)] = cal
            lr, val, runs = tune_and_run(arm, cal.sigma)
            cells.append(MultiCell(key, arm.spec.label, eps, cal.sigma, cal.accounting, lr,
                                   tuple(r.test_accuracy for r in runs), tuple(r.test_loss for r in runs), val))
            say(f"eps {eps:g} {arm.spec.label}: test accuracy {cells[-1].acc_mean:.4f} (lr {lr:g}, sigma {cal.sigma:.3f})")
    info = {}
    for k, a in arms.items():
        f = a.mech.strategy.factorization
        col = float(np.sqrt(np.max(np.sum(f.strategy**2, axis=0))))
        sens = sensitivity(f.strategy, a.schema).value if a.schema is not None else col
        info[k] = {"label": a.spec.label, "sampler": a.spec.sampler, "workload": a.spec.workload,
                   "schedule": a.spec.schedule, "beta": a.spec.beta, "gap": a.gap, "max_column_norm": col,
                   "schema": a.schema.describe(geo.n) if a.schema is not None else "Poisson sampling",
                   "schema_sensitivity": sens, "decoder_frobenius2": float(np.sum(f.decoder**2))}
    return MultiEpochResult(config, geo, data.summary(), info, calibrations, tuple(cells),
                            time.perf_counter() - t0, counter[0])
