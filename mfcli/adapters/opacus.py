"""Opacus bridge: Opacus clips per example and samples batches, mfcli adds the correlated noise
and reports the epsilon (docs/noise-streams.md, "Opacus").

Example (Opacus 1.6; ``pip install mfcli[torch,opacus]``)::

    from mfcli.adapters.opacus import make_private

    model, optimizer, loader = make_private(
        model, torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), train_loader,
        artifact="momentum.h5", seed=SECRET_SEED, noise_std=1.0, clip_norm=1.0)
    for step in range(optimizer.n):          # n Poisson batches, across as many epochs as needed
        x, y = next(batches)                 # from ``loader``
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()   # Opacus: clip + sum; mfcli: + noise_std * clip * (C^-1 Z)[t]; inner step
    optimizer.epsilon(delta=1e-6)            # MMCC upper bound at the loader's Poisson rate

Under an accounting record (``record=`` an id, or ``record=True`` for the one
:func:`mfcli.training.record.training_record` picks; e.g. the artifact of ``mfcli plan --out``),
the record decides instead: the loader draws the record's batches (Poisson, cyclic Poisson,
fixed order, balls-in-bins, shuffle; :class:`mfcli.training.torch.RecordBatchSampler`), the
noise std is the record's (a different ``noise_std``, or a ``noise_multiplier`` other than the
record's noise_std / accounted sensitivity, is refused), the noise
is that of the operator the record accounted, the loader's batch size or rate must be the
record's, and ``optimizer.epsilon()`` is the verified record's epsilon (per epoch:
``optimizer.epsilon_per_epoch()``)::

    model, optimizer, loader = make_private(model, opt, DataLoader(train_set, batch_size=100),
                                            artifact="run.h5", record=True, seed=SECRET_SEED, clip_norm=1.0)
    for x, y in loader:                      # the record's n batches
        ...

Why a subclass of Opacus's DPOptimizer and not :class:`~mfcli.adapters.torch.CorrelatedNoiseOptimizer`
around it: DPOptimizer.step recomputes ``.grad`` from the per-example gradients and its own
noise, so anything added to ``.grad`` before it runs is lost. Here the correlated noise replaces
Opacus's ``add_noise``: it is added to the clipped sum before Opacus's mean scaling, every step
that is not a skipped virtual step (BatchMemoryManager) consumes one noise row, and an empty
Poisson batch still gets its noise.

Units: ``noise_std`` is the standard deviation of the noise on C G per unit clip norm (what 0.2
called ``noise_multiplier``); ``noise_multiplier`` is noise_std / sensitivity, as Opacus and
jax_privacy count it, accepted only with ``record=`` (without a record the sensitivity the
multiplier divides by is not known, and it is refused: pass ``noise_std=``).
``optimizer.noise_multiplier`` is the record's, None without one.

Privacy: the Poisson data loader includes every example in every step independently with
probability ``sample_rate``; that is the MMCC setting of :mod:`mfcli.accounting` (``mfcli account
ARTIFACT --sigma S --sampling P``), run on the operator the noise stream uses. MMCC needs a
non-negative causal C, so a compressed operator with negative entries is refused at construction
(pass ``variant="dense"``). Wrong combinations are refused with :class:`mfcli.errors.MfcliError`:
an Opacus optimizer that adds its own noise, a clipping norm or sampling rate other than the one
declared, a data loader that is not Poisson-sampled (without a record) or not the record's
sampler and rate (with one), Opacus's accountants (which assume independent noise) attaching to
this optimizer, and a parameter group added after the bridge (it would train without noise).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from opacus import GradSampleModule
from opacus.data_loader import DPDataLoader
from opacus.optimizers.optimizer import DPOptimizer, _check_processed_flag, _mark_as_processed
from opacus.validators import ModuleValidator
from torch.utils.data import DataLoader

from mfcli.accounting.single_pass import DEFAULT_DELTA, check_sigma
from mfcli.adapters import check_gradient_stream, check_noise_options
from mfcli.adapters.torch import (
    StreamFacts,
    _numpy_dtype_for,
    load_noise_state_dict,
    noise_state_dict,
    refuse_noising_optimizer,
    split_row,
)
from mfcli.errors import MfcliError
from mfcli.services.account import (
    AccountingOptions,
    AccountingReport,
    StrategyInput,
    account,
    check_setting_applies,
    resolve_strategy,
)
from mfcli.training.noise import NoiseStream, noise_stream

#: The Opacus releases this bridge is tested against (it overrides DPOptimizer internals).
SUPPORTED_OPACUS = ("1.6.0",)


class CorrelatedNoiseDPOptimizer(StreamFacts, DPOptimizer):
    """Opacus's DPOptimizer with the Gaussian noise replaced by rows of C^-1 Z from an mfcli
    artifact. Build it with :func:`make_private`, which checks the combination.

    ``noise_std`` is the std of the noise on C G per unit clip norm: the noise added to the clipped
    sum at step t is ``noise_std * clip * (C^-1 Z)[t]`` (then divided by the expected batch size
    when ``loss_reduction="mean"``, as Opacus scales the clipped sum). :attr:`noise_multiplier` is
    noise_std / the record's accounted sensitivity (None without a record).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        stream: NoiseStream,
        accounted: StrategyInput | None,
        sample_rate: float,
        noise_std: float,
        max_grad_norm: float,
        expected_batch_size: int | None,
        loss_reduction: str = "mean",
        record: Any = None,
    ) -> None:
        # Opacus's own noise multiplier is not used: add_noise below adds mfcli's noise at noise_std
        super().__init__(optimizer, noise_multiplier=0.0, max_grad_norm=max_grad_norm,
                         expected_batch_size=expected_batch_size, loss_reduction=loss_reduction)
        #: the std of the noise on C G per unit clip norm (times max_grad_norm per step)
        self.noise_std = float(noise_std)
        self.stream = stream
        self.accounted = accounted
        self.sample_rate = float(sample_rate)
        #: the :class:`mfcli.training.record.TrainingRecord` training follows (None: MMCC at the loader's rate)
        self.record = record
        self._noise_state = stream.init()

    @property
    def noise_multiplier(self) -> float | None:
        """As :attr:`StreamFacts.noise_multiplier`; settable because DPOptimizer assigns it."""
        return super().noise_multiplier

    @noise_multiplier.setter
    def noise_multiplier(self, value: float) -> None:
        # DPOptimizer.__init__ assigns it (0 here); mfcli's noise does not read it
        self.__dict__["_opacus_noise_multiplier"] = value

    @property
    def steps_taken(self) -> int:
        """Noisy steps taken so far (skipped virtual steps do not count)."""
        return self._noise_state.t

    def add_noise(self) -> None:
        """Opacus's hook for its own noise: here ``.grad = summed clipped grad + noise_std clip (C^-1 Z)[t]``."""
        row, new_state = self.stream.next(self._noise_state)
        scale = self.noise_std * self.max_grad_norm
        for p, part in split_row(row, self.params):
            summed = p.summed_grad  # set by Opacus's clip_and_accumulate
            _check_processed_flag(summed)
            p.grad = (summed + part.mul(scale)).view_as(p)
            _mark_as_processed(summed)
        self._noise_state = new_state

    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Opacus's step (clip, accumulate, noise, scale, inner step); refuses step t >= n
        before clipping anything."""
        if self._noise_state.t >= self.stream.n and not self._check_skip_next_step(pop_next=False):
            self.stream.next(self._noise_state)   # raises the stream's "exhausted" error
        return super().step(closure)

    def add_param_group(self, param_group: dict) -> None:
        """Refused: the noise rows have the d of the parameters at construction, so a parameter
        added later would train without noise (and Opacus would fail later on it)."""
        raise MfcliError(
            "cannot add a parameter group after mfcli.adapters.opacus.make_private: its noise rows have d = "
            f"{self.stream.d}; build the optimizer with every parameter first"
        )

    def attach_step_hook(self, fn: Callable[[DPOptimizer], None]) -> None:
        """Refused: Opacus's accountants assume independent noise and would report an epsilon
        for a mechanism that does not run."""
        raise MfcliError(
            "Opacus's accountants assume independent Gaussian noise; this optimizer adds correlated noise, "
            "so its epsilon is mfcli's: optimizer.epsilon(delta) or optimizer.account(...)"
        )

    def account(self, *, delta: float = DEFAULT_DELTA, options: AccountingOptions | None = None) -> AccountingReport:
        """mfcli's MMCC accounting (bracket: upper bound, lower bound, full-participation bound)
        of all n steps at this optimizer's noise std and the data loader's Poisson rate. Refused under
        a record: its epsilon is the record's verified one (:meth:`epsilon`)."""
        if self.record is not None or self.accounted is None:
            raise MfcliError("this optimizer trains under an accounting record: its epsilon is the record's, "
                             "optimizer.epsilon() (re-account the artifact with mfcli account for other settings)")
        opts = options if options is not None else AccountingOptions(delta=delta)
        return account(self.accounted, sigma=self.noise_std, sampling=self.sample_rate, options=opts,
                       settings=("mmcc",))

    def epsilon(self, delta: float | None = None) -> float:
        """Without a record: the MMCC upper bound on epsilon at ``delta`` (default 1e-6) for the
        whole run of n steps (what ``mfcli account ARTIFACT --sigma S --sampling P`` prints for the
        same operator). Under a record: the verified record's epsilon (at its delta)."""
        if self.record is not None:
            return float(self.record.epsilon_at(delta))
        report = self.account(delta=DEFAULT_DELTA if delta is None else delta)
        assert report.mmcc is not None
        return report.mmcc.epsilon

    def epsilon_per_epoch(self, delta: float | None = None) -> list[float | None]:
        """Under a record: epsilon after each epoch (:meth:`mfcli.training.record.TrainingRecord.epsilon_per_epoch`)."""
        if self.record is None:
            raise MfcliError("epsilon per epoch needs an accounting record: make_private(..., record=...)")
        return self.record.epsilon_per_epoch(delta)

    def state_dict(self) -> dict:
        """The inner optimizer's state and the noise stream position (keep it secret, like the seed)."""
        return {"optimizer": self.original_optimizer.state_dict(),
                "noise": noise_state_dict(self.stream, self._noise_state)}

    def load_state_dict(self, state_dict: Any) -> None:
        """Restore both; refuses a noise checkpoint of another seed, artifact, d or dtype."""
        if not isinstance(state_dict, dict) or "noise" not in state_dict or "optimizer" not in state_dict:
            raise MfcliError("not a CorrelatedNoiseDPOptimizer state dict (needs 'optimizer' and 'noise')")
        state = load_noise_state_dict(self.stream, state_dict["noise"])
        self.original_optimizer.load_state_dict(state_dict["optimizer"])
        self._noise_state = state


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)


def _poisson_loader(data_loader: Any, sampling: float | None) -> DPDataLoader:
    if isinstance(data_loader, DPDataLoader):
        loader = data_loader
    elif isinstance(data_loader, DataLoader):
        try:
            loader = DPDataLoader.from_data_loader(data_loader)
        except ValueError as exc:
            raise MfcliError(f"cannot Poisson-sample this data loader: {exc}") from None
    else:
        raise MfcliError(f"data_loader must be a torch DataLoader, got {type(data_loader).__name__}")
    rate = float(loader.sample_rate)
    if not 0.0 < rate <= 1.0:
        raise MfcliError(f"the data loader's sample rate is {rate}; it must lie in (0, 1]")
    if sampling is not None and not _close(float(sampling), rate):
        raise MfcliError(
            f"the data loader includes each example with probability {rate:.6g} per step (Poisson), but "
            f"sampling={sampling!r} was declared: the epsilon would describe another sampler"
        )
    return loader


def make_private(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    data_loader: Any,
    *,
    artifact: Any,
    seed: int,
    clip_norm: float,
    noise_std: float | None = None,
    noise_multiplier: float | None = None,
    variant: str = "auto",
    sampling: float | None = None,
    loss_reduction: str = "mean",
    dtype: str | None = None,
    record: str | bool | None = None,
    non_adaptive: bool = False,
) -> tuple[GradSampleModule, CorrelatedNoiseDPOptimizer, DataLoader]:
    """Opacus clips and Poisson-samples, mfcli adds the correlated noise and accounts it.

    Args:
        module: the model (wrapped in an Opacus GradSampleModule unless it is one already).
        optimizer: a plain ``torch.optim`` optimizer over the module's parameters, or an Opacus
            DPOptimizer made with ``noise_multiplier=0`` (e.g. by ``PrivacyEngine.make_private``),
            whose clipping norm and batch scaling must then agree with ``clip_norm`` and the
            loader; its Opacus accountant is not used (do not ask ``PrivacyEngine`` for epsilon).
        data_loader: a DataLoader (replaced by Opacus's Poisson DPDataLoader with rate
            1 / len(data_loader), as Opacus does) or a DPDataLoader (its rate is used).
        artifact: an mfcli artifact (path or loaded Artifact) over n steps: training takes n steps.
        seed: the secret noise seed in [0, 2^128) (under a record, of the batches too).
        noise_std: the std of the correlated noise on C G per unit clip norm (``mfcli account
            --sigma``; 0.2's ``noise_multiplier``); under a record, optional and checked against
            the record's.
        noise_multiplier: noise_std / sensitivity (Opacus's and jax_privacy's count); only with
            ``record``, checked against the record's; refused without one.
        clip_norm: the per-example clipping norm (Opacus's ``max_grad_norm``).
        variant: the artifact operator, ``auto``, ``dense`` or ``compressed``.
        sampling: the rate you accounted with (``mfcli account --sampling``), checked against the
            loader's; None to take the loader's.
        loss_reduction: ``mean`` or ``sum``, how the loss aggregates the batch (as in Opacus).
        dtype: noise dtype; default float64 if every parameter is float64, else float32.
        record: train under this accounting record of the artifact (its id; True: the one
            :func:`mfcli.training.record.training_record` picks): the record's sampler, noise std and
            operator, its verified epsilon (module docstring). None: Poisson sampling and MMCC.
        non_adaptive: allow a balls-in-bins record (contributions fixed in advance).

    Returns:
        (GradSampleModule, CorrelatedNoiseDPOptimizer, loader), like Opacus's make_private; the
        loader is Opacus's Poisson DPDataLoader, or under a record a DataLoader over the record's batches.

    Raises:
        MfcliError: any combination whose epsilon would not describe the training (see the module
            docstring), or an invalid option.
    """
    if record is not None and record is not False:
        return _make_private_from_record(module, optimizer, data_loader, artifact=artifact, seed=seed,
                                         noise_std=noise_std, noise_multiplier=noise_multiplier,
                                         clip_norm=clip_norm, variant=variant,
                                         sampling=sampling, loss_reduction=loss_reduction, dtype=dtype,
                                         record=None if record is True else record, non_adaptive=non_adaptive)
    from mfcli.training.record import resolve_noise_std

    std = resolve_noise_std(noise_std=noise_std, noise_multiplier=noise_multiplier, record=None)
    assert std is not None
    _check_common(std, clip_norm, loss_reduction)
    loader = _poisson_loader(data_loader, sampling)
    n_data = len(loader.dataset)
    expected_batch_size = int(n_data * loader.sample_rate)
    if loss_reduction == "mean" and expected_batch_size < 1:
        raise MfcliError(f"the expected batch size {n_data} x {loader.sample_rate:.6g} rounds to 0")
    inner = _plain_optimizer(optimizer, clip_norm=clip_norm, loss_reduction=loss_reduction,
                             expected_batch_size=expected_batch_size)

    params = _check_module(module, inner)

    stream = noise_stream(artifact, kind="gradient", d=sum(p.numel() for p in params), seed=seed,
                          dtype=dtype or _numpy_dtype_for(params), variant=variant)
    check_gradient_stream(stream, "the Opacus bridge")
    accounted = resolve_strategy(stream.source, operator=variant)
    if accounted.operator != stream.accounted_operator:   # the two selections must agree
        raise MfcliError(f"internal: the stream runs {stream.accounted_operator} but {accounted.operator} would be accounted")
    try:
        check_setting_applies(accounted, "mmcc")
    except MfcliError as exc:
        hint = "; pass variant='dense'" if accounted.operator != "dense" else ""
        raise MfcliError(f"Poisson-sampled training is accounted by MMCC, and {exc}{hint}") from None
    # Last, once every check has passed: wrapping installs hooks on the caller's model.
    gs_module = module if isinstance(module, GradSampleModule) else GradSampleModule(module)
    dp_opt = CorrelatedNoiseDPOptimizer(
        inner, stream=stream, accounted=accounted, sample_rate=loader.sample_rate,
        noise_std=std, max_grad_norm=float(clip_norm),
        expected_batch_size=expected_batch_size, loss_reduction=loss_reduction,
    )
    return gs_module, dp_opt, loader


def _check_common(noise_std: Any, clip_norm: Any, loss_reduction: str) -> None:
    check_noise_options(noise_std=noise_std, clip_norm=clip_norm, batch_size=None, postprocess=None)
    check_sigma(noise_std)   # sigma = 0 has no finite epsilon: refused here, not after training
    if clip_norm == 0:
        raise MfcliError("clip_norm must be positive: Opacus clips per-example gradients to it")
    if loss_reduction not in ("mean", "sum"):
        raise MfcliError(f"loss_reduction must be 'mean' or 'sum', got {loss_reduction!r}")


def _check_module(module: Any, inner: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The inner optimizer's trainable parameters, after checking Opacus can clip them per example."""
    if not isinstance(module, torch.nn.Module):
        raise MfcliError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    if not isinstance(module, GradSampleModule):
        errors = ModuleValidator.validate(module, strict=False)
        if errors:
            raise MfcliError(f"Opacus cannot compute per-example gradients for this model: {errors[0]}")
    module_params = {id(p) for p in module.parameters()}
    params = [p for g in inner.param_groups for p in g["params"] if p.requires_grad]
    if not params:
        raise MfcliError("the optimizer has no trainable parameters")
    if any(id(p) not in module_params for p in params):
        raise MfcliError("the optimizer holds parameters that are not the module's: Opacus has no per-example gradients for them")
    return params


def _make_private_from_record(
    module: torch.nn.Module, optimizer: torch.optim.Optimizer, data_loader: Any, *, artifact: Any, seed: int,
    noise_std: float | None, noise_multiplier: float | None, clip_norm: float, variant: str, sampling: float | None,
    loss_reduction: str,
    dtype: str | None, record: str | None, non_adaptive: bool,
) -> tuple[GradSampleModule, CorrelatedNoiseDPOptimizer, DataLoader]:
    """:func:`make_private` under an accounting record (its docstring)."""
    from pathlib import Path

    from torch.utils.data import default_collate

    from mfcli.training.noise import check_seed
    from mfcli.training.record import build_sampler, check_declared, record_stream, resolve_noise_std, training_record
    from mfcli.training.torch import RecordBatchSampler, _EmptySafeCollate

    if not isinstance(artifact, (str, Path)):
        raise MfcliError("record= needs the artifact's path (the records are read from the file)")
    if variant != "auto":
        raise MfcliError("record= trains the operator the record accounted; leave variant='auto'")
    rec = training_record(artifact, record)
    std = resolve_noise_std(noise_std=noise_std, noise_multiplier=noise_multiplier, record=rec)
    assert std is not None
    _check_common(std, clip_norm, loss_reduction)
    seed = check_seed(seed)
    if not isinstance(data_loader, DataLoader):
        raise MfcliError(f"data_loader must be a torch DataLoader, got {type(data_loader).__name__}")
    dataset = data_loader.dataset
    examples = len(dataset)
    declared_rate = sampling
    declared_batch = None
    if isinstance(data_loader, DPDataLoader):
        if declared_rate is not None and not _close(float(declared_rate), float(data_loader.sample_rate)):
            raise MfcliError(f"the data loader's Poisson rate is {data_loader.sample_rate:.6g} but sampling={sampling!r} "
                             "was declared")
        declared_rate = float(data_loader.sample_rate)
        if rec.sampler != "poisson":
            raise MfcliError(f"the data loader is Opacus's Poisson DPDataLoader, but accounting record {rec.record!r} "
                             f"accounts {rec.sampler} batches; pass the plain DataLoader")
    elif data_loader.batch_size is not None:
        declared_batch = int(data_loader.batch_size)
    check_declared(rec, examples=examples, noise_std=std, sample_rate=declared_rate,
                   batch_size=declared_batch)
    batches = build_sampler(rec, examples=examples, seed=seed, non_adaptive=non_adaptive)
    expected_batch_size = max(1, round(batches.expected_batch_size(0)))
    inner = _plain_optimizer(optimizer, clip_norm=clip_norm, loss_reduction=loss_reduction,
                             expected_batch_size=expected_batch_size)
    params = _check_module(module, inner)
    stream = record_stream(rec, d=sum(p.numel() for p in params), seed=seed, dtype=dtype or _numpy_dtype_for(params))
    check_gradient_stream(stream, "the Opacus bridge")
    # a loader without batching (batch_size=None) converts examples one by one; batches need collating
    collate = data_loader.collate_fn if data_loader.batch_sampler is not None else default_collate
    record_batches = RecordBatchSampler(batches)
    loader = DataLoader(dataset, batch_sampler=record_batches,
                        collate_fn=_EmptySafeCollate(dataset, collate),
                        num_workers=data_loader.num_workers)
    gs_module = module if isinstance(module, GradSampleModule) else GradSampleModule(module)
    dp_opt = CorrelatedNoiseDPOptimizer(
        inner, stream=stream, accounted=None, sample_rate=rec.sampling or 0.0,
        noise_std=std, max_grad_norm=float(clip_norm),
        expected_batch_size=expected_batch_size, loss_reduction=loss_reduction, record=rec,
    )
    record_batches.follow = dp_opt   # iteration starts at the optimizer's next noise step
    return gs_module, dp_opt, loader


def _plain_optimizer(optimizer: Any, *, clip_norm: float, loss_reduction: str, expected_batch_size: int) -> torch.optim.Optimizer:
    """The optimizer to wrap: a plain one as is; an Opacus DPOptimizer that adds no noise and
    agrees with the declared clipping and batch scaling, unwrapped; anything else refused."""
    if isinstance(optimizer, DPOptimizer):
        if type(optimizer) is not DPOptimizer:
            raise MfcliError(
                f"an Opacus {type(optimizer).__name__} changes clipping, noise or distribution; only the "
                "plain DPOptimizer (or a torch.optim optimizer) can carry mfcli's correlated noise"
            )
        if optimizer.noise_multiplier != 0:
            raise MfcliError(
                f"the Opacus DPOptimizer adds its own independent noise (noise_multiplier={optimizer.noise_multiplier}); "
                "make it with noise_multiplier=0 (mfcli adds the noise) or pass the plain torch optimizer"
            )
        if not _close(float(optimizer.max_grad_norm), float(clip_norm)):
            raise MfcliError(
                f"the Opacus DPOptimizer clips to max_grad_norm={optimizer.max_grad_norm} but clip_norm={clip_norm} "
                "was declared: the noise scale and the sensitivity must use the clipping that runs"
            )
        if optimizer.loss_reduction != loss_reduction:
            raise MfcliError(
                f"the Opacus DPOptimizer has loss_reduction={optimizer.loss_reduction!r} but {loss_reduction!r} was declared"
            )
        if loss_reduction == "mean" and optimizer.expected_batch_size != expected_batch_size:
            raise MfcliError(
                f"the Opacus DPOptimizer averages over expected_batch_size={optimizer.expected_batch_size}, but the "
                f"Poisson loader's expected batch is {expected_batch_size}: it was made for another sampling rate"
            )
        return optimizer.original_optimizer
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise MfcliError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    refuse_noising_optimizer(optimizer, "make_private")
    return optimizer


__all__ = ["SUPPORTED_OPACUS", "CorrelatedNoiseDPOptimizer", "make_private"]
