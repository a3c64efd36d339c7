"""Private training in PyTorch from an accounting record, in one call (docs/training.md).

Example (``pip install mfcli[torch]``)::

    from mfcli.training.torch import make_private, make_private_with_epsilon

    # from a plan: runs mfcli plan's library path, writes run.h5 with its accounting record
    model, optimizer, loader = make_private_with_epsilon(
        model, torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), train_set,
        epsilon=4.0, delta=1e-5, epochs=10, batch_size=100, artifact="run.h5",
        seed=secrets.randbits(128), clip_norm=1.0, loss_fn=torch.nn.functional.cross_entropy)
    # or from an artifact you already have: make_private(model, opt, train_set, artifact="run.h5", ...)
    for x, y in loader:                  # the record's n batches, exactly as accounted
        optimizer.zero_grad()
        optimizer.clipped_backward(x, y)  # per-example gradients (torch.func), clipped, summed
        optimizer.step()                 # + noise_std clip (C^-1 Z)[t], / batch size, inner step
    optimizer.epsilon()                  # the verified record's epsilon
    optimizer.epsilon_per_epoch()        # after each epoch, where the accounting gives one

What runs is what the record accounts: the DataLoader's batch sampler is the record's
(:func:`mfcli.training.record.build_sampler`: Poisson, cyclic Poisson, fixed order,
balls-in-bins, shuffle), the noise is the artifact's correlated noise at the record's noise std for
the operator the record accounted (:class:`mfcli.adapters.torch.CorrelatedNoiseOptimizer` over
:func:`mfcli.training.record.record_stream`), and training takes the artifact's n steps. Declared numbers
(``noise_std`` or ``noise_multiplier``, ``sampler``, ``sample_rate``, ``batch_size``) that disagree with the record
are refused in one line. The record is re-verified against the operator before training
(``mfcli inspect``'s check).

Clipping. :meth:`PrivateOptimizer.clipped_backward` computes every example's gradient with
``torch.func.vmap(torch.func.grad(...))``, scales it to norm at most ``clip_norm`` (factor
min(1, clip / norm)), sums them and stores sum / B in ``.grad``, B the record's expected batch
size (a public constant fixed before training, as Opacus's ``expected_batch_size``; the noise is
divided by the same B). :meth:`step` refuses gradients that ``clipped_backward`` did not produce
(a plain ``loss.backward()`` would train unclipped: no privacy). The model must treat examples
independently (no batch norm). With Opacus installed and a ``loss.backward()`` loop preferred, use
:func:`mfcli.adapters.opacus.make_private` with ``record=``.

Data parallel. Called in every process of a ``torch.distributed`` group (``world_size`` > 1),
every rank builds the same sampler from the shared seed and keeps its share of each batch (the
examples at positions rank, rank + W, ... of the sorted batch), so the union of the ranks' batches
is the accounted batch. Each rank clips its own examples; :meth:`step` sums the clipped sums over
the ranks (``all_reduce``) and then every rank adds the same noise row: the row is a pure
function of (seed, step), so the ranks draw identical noise without communicating, and the noisy
gradient (clipped sum over all ranks plus one noise row) is identical on every rank. Noise is
therefore added exactly once per step, as accounted; every rank's inner optimizer then takes the
same step. The seed is checked to be the same on every rank at construction.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from mfcli.adapters.torch import CorrelatedNoiseOptimizer, refuse_noising_optimizer
from mfcli.errors import MfcliError
from mfcli.training.noise import check_seed
from mfcli.training.record import RecordOptions, TrainingRecord, check_clip_norm, declared_batches, record_stream

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11; annotations only, so no runtime dependency


def _world() -> tuple[int, int]:
    """(rank, world size) of the default torch.distributed group; (0, 1) without one."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class RecordBatchSampler(Sampler[list[int]]):
    """A torch batch sampler over an mfcli sampler's batches, steps ``start`` .. n - 1.

    With ``world_size`` > 1, rank r yields the examples at positions r, r + W, ... of each sorted
    batch (its share; the shares of the W ranks are disjoint and their union is the batch).
    Batches are drawn as the record's sampler draws them: never padded, truncated or skipped (an
    empty batch is yielded as an empty list and still takes its step and its noise row).
    """

    def __init__(self, sampler: Any, *, start: int = 0, rank: int = 0, world_size: int = 1,
                 follow: Any = None) -> None:
        if not 0 <= rank < world_size:
            raise MfcliError(f"rank must be in [0, {world_size - 1}], got {rank}")
        self.sampler = sampler
        self.start = int(start)
        self.rank = rank
        self.world_size = world_size
        #: an optimizer with ``steps_taken``: iteration then starts at its next step, so batch t
        #: always meets noise row t (after ``load_state_dict`` too) and no batch is replayed
        self.follow = follow

    def _first(self) -> int:
        return int(self.follow.steps_taken) if self.follow is not None else self.start

    def __iter__(self) -> Iterator[list[int]]:
        for b in self.sampler.batches(self._first()):
            yield b[self.rank :: self.world_size].tolist()

    def __len__(self) -> int:
        return int(self.sampler.steps) - self._first()


class _EmptySafeCollate:
    """The collate function, except that an empty batch becomes the collated first example cut
    to length 0 (torch's default collate cannot collate nothing; an empty Poisson batch is a
    legitimate step)."""

    def __init__(self, dataset: Any, collate: Callable[[list], Any]) -> None:
        self.dataset = dataset
        self.collate = collate

    def __call__(self, batch: list) -> Any:
        if batch:
            return self.collate(batch)
        proto = self.collate([self.dataset[0]])
        return _cut(proto)

    # pickled to DataLoader worker processes: plain attributes only


def _cut(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x[:0]
    if isinstance(x, (list, tuple)):
        return type(x)(_cut(v) for v in x)
    if isinstance(x, dict):
        return {k: _cut(v) for k, v in x.items()}
    return x


def _seed_digest(seed: int) -> int:
    """A 63-bit one-way digest of the seed, compared across ranks (the seed itself stays local)."""
    h = hashlib.sha256(f"mfcli-training-seed|{seed}".encode()).digest()
    return int.from_bytes(h[:8], "little") >> 1


class PrivateOptimizer(CorrelatedNoiseOptimizer):
    """A :class:`~mfcli.adapters.torch.CorrelatedNoiseOptimizer` that clips per example and
    follows one accounting record. Build it with :func:`make_private`.

    Attributes:
        record: the :class:`~mfcli.training.record.TrainingRecord` the run follows.
        sampler: the mfcli batch sampler of the DataLoader (the whole batches, before sharding).
        expected_batch_size: B, the constant the clipped sum and the noise are divided by.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, *, module: torch.nn.Module, record: TrainingRecord,
                 sampler: Any, seed: int, clip_norm: float, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 expected_batch_size: int, max_physical_batch_size: int | None, dtype: str | None) -> None:
        params = CorrelatedNoiseOptimizer._collect(optimizer.param_groups)
        if not params:
            raise MfcliError("the optimizer has no trainable parameters")
        named = {id(p): name for name, p in module.named_parameters() if p.requires_grad}
        if {id(p) for p in params} != set(named):
            raise MfcliError("the optimizer's trainable parameters must be exactly the module's trainable parameters: "
                             "every parameter that trains is clipped and noised, and only those")
        dt = dtype or ("float64" if all(p.dtype == torch.float64 for p in params) else "float32")
        stream = record_stream(record, d=sum(p.numel() for p in params), seed=seed, dtype=dt)
        super().__init__(optimizer, stream=stream, record=record, clip_norm=clip_norm, batch_size=expected_batch_size)
        self.module = module
        self.record = record
        self.sampler = sampler
        self.loss_fn = loss_fn
        self.expected_batch_size = expected_batch_size
        self.max_physical_batch_size = max_physical_batch_size
        self._names = [named[id(p)] for p in params]
        self._prepared: list[tuple[torch.Tensor, int]] | None = None
        self.rank, self.world_size = _world()
        if self.world_size > 1:
            digest = torch.tensor([_seed_digest(seed)], dtype=torch.int64)
            gathered = [torch.zeros_like(digest) for _ in range(self.world_size)]
            torch.distributed.all_gather(gathered, digest)
            if any(int(g) != int(digest) for g in gathered):
                raise MfcliError("the ranks were given different seeds: the same seed on every rank draws the same "
                                 "batches and the same noise row, so that the noise is added once")

    # ------------------------------------------------------------------ privacy

    def epsilon(self, delta: float | None = None) -> float:
        """The verified record's epsilon for the whole run (at the record's delta; another delta is
        refused: re-account with ``mfcli account --delta``)."""
        return self.record.epsilon_at(delta)

    def epsilon_per_epoch(self, delta: float | None = None) -> list[float | None]:
        """Epsilon of the model after each epoch (:meth:`TrainingRecord.epsilon_per_epoch`)."""
        return self.record.epsilon_per_epoch(delta)

    # ------------------------------------------------------------------ clipping

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._prepared = None
        super().zero_grad(set_to_none=set_to_none)

    def clipped_backward(self, *inputs: torch.Tensor, target: torch.Tensor | None = None) -> torch.Tensor:
        """Per-example gradients of ``loss_fn(module(x), y)``, each clipped to ``clip_norm``, summed
        and divided by the expected batch size, into ``.grad``. Call as ``clipped_backward(x, y)``
        (the last positional tensor is the target) or ``clipped_backward(x, target=y)``.

        Returns the per-example losses (detached) for logging. An empty batch sets zero gradients.
        """
        from torch.func import functional_call, grad, vmap

        if target is None:
            if len(inputs) < 2:
                raise MfcliError("clipped_backward needs the inputs and the target: clipped_backward(x, y)")
            *xs, target = inputs
        else:
            xs = list(inputs)
        params = dict(zip(self._names, self._params, strict=True))
        detached = {k: v.detach() for k, v in params.items()}
        buffers = {k: v.detach() for k, v in self.module.named_buffers()}
        module, loss_fn = self.module, self.loss_fn

        def loss_one(p: dict, b: dict, *example: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            *x1, y1 = (e.unsqueeze(0) for e in example)
            loss = loss_fn(functional_call(module, (p, b), tuple(x1)), y1)
            return loss, loss.detach()

        per_example = vmap(grad(loss_one, has_aux=True), in_dims=(None, None, *([0] * (len(xs) + 1))),
                           randomness="different")
        count = int(target.shape[0])
        sums = {k: torch.zeros_like(v) for k, v in detached.items()}
        losses = []
        chunk = self.max_physical_batch_size or max(count, 1)
        for lo in range(0, count, chunk):
            part = [x[lo:lo + chunk] for x in (*xs, target)]
            g, loss = per_example(detached, buffers, *part)
            norms = torch.sqrt(sum(gi.reshape(gi.shape[0], -1).pow(2).sum(1) for gi in g.values()))
            # min(1, clip / norm); 1 for a zero gradient. Each scaled gradient has norm <= clip.
            factor = torch.where(norms > self.clip_norm, self.clip_norm / norms.clamp_min(1e-30), torch.ones_like(norms))
            for k, gi in g.items():
                sums[k] += torch.einsum("b,b...->...", factor.to(gi.dtype), gi)
            losses.append(loss.reshape(-1))
        prepared = []
        for k, p in params.items():
            p.grad = sums[k].div_(self.expected_batch_size)
            prepared.append((p.grad, p.grad._version))
        self._prepared = prepared
        return torch.cat(losses) if losses else torch.zeros(0)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Sum the clipped gradients over the ranks (data parallel), add the noise row, inner step.

        Refuses gradients that :meth:`clipped_backward` did not produce since the last
        :meth:`zero_grad` (unclipped or accumulated gradients would void the accounting)."""
        if closure is not None:
            raise MfcliError("PrivateOptimizer.step takes no closure: compute the gradients with clipped_backward")
        prepared = self._prepared
        if prepared is None or len(prepared) != len(self._params) or any(
                p.grad is not g or g._version != v for p, (g, v) in zip(self._params, prepared, strict=True)):
            raise MfcliError("the gradients were not produced by clipped_backward since the last zero_grad (or were "
                             "changed after it): an unclipped gradient has no privacy guarantee")
        self._prepared = None
        if self.world_size > 1:
            for p in self._params:
                assert p.grad is not None
                torch.distributed.all_reduce(p.grad, op=torch.distributed.ReduceOp.SUM)
        return super().step()


def _check_module(module: Any) -> None:
    if not isinstance(module, torch.nn.Module):
        raise MfcliError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    bn = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.SyncBatchNorm)
    for name, m in module.named_modules():
        if isinstance(m, bn):
            raise MfcliError(f"module {name or type(module).__name__} is a batch norm, which mixes the examples of a "
                             "batch: per-example clipping does not bound their influence; use GroupNorm or LayerNorm")


def _examples(dataset: Dataset) -> int:
    """N, the number of examples of a map-style dataset (the batch samplers draw indices 0..N-1)."""
    try:
        examples = len(dataset)
    except TypeError:
        raise MfcliError("dataset must be a map-style dataset with a length (the sampler draws indices)") from None
    if examples < 1:
        raise MfcliError("the dataset is empty")
    return examples


def make_private(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    dataset: Dataset,
    *,
    artifact: str | Path,
    seed: int,
    clip_norm: float,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    max_physical_batch_size: int | None = None,
    collate_fn: Callable[[list], Any] | None = None,
    num_workers: int = 0,
    dtype: str | None = None,
    **options: Unpack[RecordOptions],
) -> tuple[torch.nn.Module, PrivateOptimizer, DataLoader]:
    """Train ``module`` under one accounting record of ``artifact``.

    Args:
        module: the model (returned as is; examples must be independent: no batch norm).
        optimizer: a plain ``torch.optim`` optimizer over exactly the module's trainable parameters
            (the artifact's workload: plain SGD for ``prefix``, SGD with momentum beta for ``momentum``).
        dataset: a map-style dataset of (input, ..., target) examples; its length is N.
        artifact: the artifact (``mfcli plan --out``, ``mfcli account --write``).
        seed: the secret seed in [0, 2^128) of the batches and the noise (``secrets.randbits(128)``;
            the same on every rank).
        clip_norm: the per-example clipping norm.
        loss_fn: ``loss_fn(output, target)`` for one example (called under ``vmap``).
        max_physical_batch_size: per-example gradients are computed in chunks of at most this many.
        collate_fn, num_workers: as for ``torch.utils.data.DataLoader``.
        dtype: noise dtype (default float64 when every parameter is, else float32).
        **options: the record and the numbers declared about it, checked against it
            (:class:`mfcli.training.record.RecordOptions`): ``record`` (its id; None picks one),
            ``noise_std`` or ``noise_multiplier``, ``sampler``, ``sample_rate``, ``batch_size``,
            ``non_adaptive`` (allow a balls-in-bins record) and ``verify`` (re-verify the record
            first; default).

    Returns:
        (module, optimizer, loader): ``loader`` yields the record's batches (this rank's share
        under torch.distributed), one per step, from the optimizer's next step: after
        ``optimizer.load_state_dict`` (inner state and noise position) iterating it resumes
        where the noise resumes.

    Raises:
        MfcliError: a record that is missing or does not verify, a declaration that disagrees with
            it, a bad option, or a model and optimizer that do not fit together.
    """
    _check_module(module)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise MfcliError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    refuse_noising_optimizer(optimizer, "make_private")
    clip_norm = check_clip_norm(clip_norm)
    if not callable(loss_fn):
        raise MfcliError("loss_fn must be callable: loss_fn(output, target)")
    if max_physical_batch_size is not None and (isinstance(max_physical_batch_size, bool) or not isinstance(
            max_physical_batch_size, int) or max_physical_batch_size < 1):
        raise MfcliError(f"max_physical_batch_size must be a positive integer, got {max_physical_batch_size!r}")
    seed = check_seed(seed)
    examples = _examples(dataset)
    rec, batches, expected = declared_batches(artifact, examples=examples, seed=seed, **options)
    opt = PrivateOptimizer(optimizer, module=module, record=rec, sampler=batches, seed=seed, clip_norm=clip_norm,
                           loss_fn=loss_fn, expected_batch_size=expected,
                           max_physical_batch_size=max_physical_batch_size, dtype=dtype)
    from torch.utils.data import default_collate

    loader = DataLoader(dataset, batch_sampler=RecordBatchSampler(batches, rank=opt.rank, world_size=opt.world_size,
                                                                  follow=opt),
                        collate_fn=_EmptySafeCollate(dataset, collate_fn or default_collate), num_workers=num_workers)
    return module, opt, loader


def workload_of(optimizer: torch.optim.Optimizer) -> tuple[str, float]:
    """(workload, beta) an SGD optimizer computes: ``prefix`` for plain SGD, ``momentum`` with
    beta for heavy-ball momentum (dampening 0, no Nesterov). Anything else: MfcliError (say the
    workload explicitly)."""
    if isinstance(optimizer, torch.optim.SGD):
        moms = {(g.get("momentum", 0.0), g.get("dampening", 0.0), g.get("nesterov", False)) for g in optimizer.param_groups}
        if len(moms) == 1:
            mom, damp, nest = moms.pop()
            if mom == 0:
                return "prefix", 0.9
            if damp == 0 and not nest:
                return "momentum", float(mom)
    raise MfcliError(f"cannot tell which workload a {type(optimizer).__name__} computes; pass workload='prefix' or "
                     "'momentum' (with beta) to plan for it")


def make_private_with_epsilon(
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    dataset: Dataset,
    *,
    epsilon: float,
    delta: float,
    epochs: int,
    batch_size: int,
    artifact: str | Path,
    seed: int,
    clip_norm: float,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    workload: str | None = None,
    beta: float | None = None,
    batching: Sequence[str] | None = None,
    bands: Sequence[int] | None = None,
    workers: int | None = 0,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
    **kwargs: Any,
) -> tuple[torch.nn.Module, PrivateOptimizer, DataLoader]:
    """Plan for a target (epsilon, delta), write the recommended artifact and record, then
    :func:`make_private` under that record.

    Runs ``mfcli plan``'s library path (:func:`mfcli.services.plan.make_plan` over every candidate the
    allowed ``batching`` samplers admit, :func:`mfcli.services.plan.write_artifact` of the recommendation,
    which re-accounts it on the written file) for N = len(dataset) examples, ``batch_size``,
    ``epochs``, the optimizer's workload (:func:`workload_of`, or ``workload``/``beta``) and the
    model's parameter count. ``workers``: plan's process pool (0: this process; None: every core).
    The plan is kept as ``optimizer.plan`` (:class:`mfcli.services.plan.Plan`). Other keyword arguments go
    to :func:`make_private`.

    Raises:
        MfcliError: as ``mfcli plan`` (no candidate reaches the target, a bad setup), an existing
            ``artifact`` without ``force``, or as :func:`make_private`.
    """
    from mfcli.training.record import plan_and_write

    _check_module(module)
    if workload is None:
        workload, found_beta = workload_of(optimizer)
        beta = found_beta if beta is None else beta
    examples = _examples(dataset)
    params = sum(p.numel() for p in module.parameters() if p.requires_grad)
    plan, rid = plan_and_write(
        examples=examples, batch_size=batch_size, epochs=epochs, epsilon=epsilon, delta=delta, workload=workload,
        beta=beta, params=params, artifact=artifact, batching=batching, bands=bands, workers=workers, force=force,
        progress=progress,
        command=f"mfcli.training.torch.make_private_with_epsilon(epsilon={epsilon}, delta={delta}, epochs={epochs}, "
                f"batch_size={batch_size}, examples={examples})")
    kwargs.setdefault("batch_size", batch_size)
    model, opt, loader = make_private(module, optimizer, dataset, artifact=artifact, record=rid, seed=seed,
                                      clip_norm=clip_norm, loss_fn=loss_fn, **kwargs)
    opt.plan = plan
    return model, opt, loader


__all__ = ["PrivateOptimizer", "RecordBatchSampler", "make_private", "make_private_with_epsilon", "workload_of"]
