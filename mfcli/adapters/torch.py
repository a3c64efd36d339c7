"""PyTorch adapter: correlated gradient noise from an mfcli artifact, added before each step.

Example (the model's gradients must be the SUM of per-example gradients each clipped to norm
``clip``, e.g. from your own per-example clipping or a DP library)::

    import torch
    from mfcli.adapters.torch import CorrelatedNoiseOptimizer
    from mfcli.io.artifact import shipped_artifact

    inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)   # runs the workload A
    opt = CorrelatedNoiseOptimizer(inner, artifact=shipped_artifact("momentum-n256"), seed=SECRET_SEED,
                                   noise_std=1.0, clip_norm=1.0)
    for step in range(opt.n):
        opt.zero_grad()
        summed_clipped_grads(model, batch).backward()
        opt.step()            # grad += noise_std * clip * (C^-1 Z)[t]; then the inner step

Units: ``noise_std`` is the standard deviation of the noise on C G per unit clip norm (what 0.2
called ``noise_multiplier``). ``noise_multiplier=`` is noise_std / sensitivity (as Opacus and
jax_privacy use it) and is accepted only with ``record=`` (a verified
:class:`mfcli.training.record.TrainingRecord`, whose accounted sensitivity it divides by);
without one it is refused (:func:`mfcli.training.record.resolve_noise_std` has the table).

The noise is the artifact's **gradient** noise, row t of C^-1 Z (C^^-1 Z for a compressed artifact).
With an inner optimizer that computes the artifact's workload A (plain SGD for ``prefix``,
SGD with ``momentum=beta`` and ``dampening=0`` for ``momentum``) the released iterates carry the
noise B Z the factorization was optimised for. Step t >= n raises :class:`mfcli.errors.MfcliError`.
It is a ``torch.optim.Optimizer``: LR schedulers, step hooks, ``zero_grad(set_to_none=...)`` and
``state_dict`` behave as in torch (docs/frameworks.md). With Opacus, use
:func:`mfcli.adapters.opacus.make_private`; wrapping an Opacus optimizer here is refused.

Where the noise is drawn: on the parameters' device (``generator="torch"``, the default for
parameters on an accelerator): a ``torch.Generator`` on that device seeded per (seed, step)
(:func:`torch_seed`) draws Z[t], and the stream's recursion (the same
:meth:`~mfcli.strategies.operators.StreamingMatrix.step` as the numpy stream) runs on device tensors: no
host round trip and no copy. For CPU parameters the default is the numpy reference stream
(``generator="numpy"``), whose rows reach torch without a copy. The two generators draw different
Z (each is reproducible per seed: docs/noise-streams.md, "Reproducibility").

Formal guarantees: training is the mechanism C G + Z with Z ~ N(0, (noise_std clip)^2) entry-wise,
so its privacy is that of a Gaussian mechanism with sensitivity :attr:`sensitivity` x clip and
noise noise_std x clip (single participation; see the accounting docs). The optimizer is
post-processing; a mismatch between it and A costs accuracy, not privacy, and only warns.
"""
from __future__ import annotations

import hashlib
import math
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch

from mfcli.adapters import check_gradient_stream, check_noise_options
from mfcli.errors import MfcliError
from mfcli.training.noise import NoiseState, NoiseStream, cast_tables, check_step, noise_stream
from mfcli.training.record import record_stream, resolve_noise_std
from mfcli.util.forward import Forwarded

#: Generators of the noise rows: ``numpy`` (the reference stream, drawn on the host), ``torch``
#: (drawn on the parameters' device), ``auto`` (numpy for CPU parameters, torch elsewhere).
GENERATORS = ("auto", "numpy", "torch")


def _numpy_dtype_for(params: list[torch.Tensor]) -> str:
    return "float64" if params and all(p.dtype == torch.float64 for p in params) else "float32"


def refuse_noising_optimizer(optimizer: Any, what: str) -> None:
    """Refuse an inner optimizer that adds noise of its own or rewrites ``.grad`` in ``step``.

    An Opacus optimizer's ``step`` recomputes ``.grad`` from the per-sample gradients (clipped
    sum plus its own Gaussian noise), so noise added to ``.grad`` before it runs is silently
    discarded: training then carries Opacus's noise only, and mfcli's accounting would describe
    a mechanism that did not run. A CorrelatedNoiseOptimizer inside another adds noise twice.
    Detected by class lineage, so Opacus need not be importable.
    """
    kind = type(optimizer)
    if any(c.__module__.split(".")[0] == "opacus" for c in kind.__mro__):
        nm = getattr(optimizer, "noise_multiplier", None)
        raise MfcliError(
            f"{what} cannot wrap an Opacus {kind.__name__} (noise_multiplier={nm!r}): its step() overwrites "
            ".grad with its own clipped sum plus its own noise, so the correlated noise would be silently "
            "lost; use mfcli.adapters.opacus.make_private (Opacus clips and samples, mfcli adds the noise)"
        )
    if isinstance(optimizer, CorrelatedNoiseOptimizer):
        raise MfcliError(f"{what} cannot wrap another CorrelatedNoiseOptimizer: the noise would be added twice")


def noise_state_dict(stream: NoiseStream, state: NoiseState) -> dict:
    """A noise stream checkpoint as tensors and plain values (``torch.load(weights_only=True)``)."""
    sd = stream.state_dict(state)
    sd["running"] = torch.from_numpy(np.ascontiguousarray(sd["running"]))
    return sd


def load_noise_state_dict(stream: NoiseStream, sd: Mapping[str, Any]) -> NoiseState:
    """Inverse of :func:`noise_state_dict`; the stream refuses another seed, artifact, d, dtype
    or an edited checkpoint (HMAC tag)."""
    return stream.load_state_dict(_host_checkpoint(sd))


def _host_checkpoint(sd: Mapping[str, Any]) -> dict:
    out = dict(sd) if isinstance(sd, Mapping) else sd
    if isinstance(out, dict) and isinstance(out.get("running"), torch.Tensor):
        out["running"] = out["running"].detach().cpu().numpy()
    return out


def split_row(row: np.ndarray, params: list[torch.Tensor]) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """(parameter, its slice of a flat noise row shaped, typed and placed like it), in order."""
    yield from split_tensor(torch.from_numpy(row), params)


def split_tensor(noise: torch.Tensor, params: list[torch.Tensor]) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """(parameter, its slice of a flat noise tensor shaped, typed and placed like it), in order."""
    offset = 0
    for p in params:
        k = p.numel()
        yield p, noise[offset : offset + k].view_as(p).to(device=p.device, dtype=p.dtype)
        offset += k


def torch_seed(seed: int, j: int) -> int:
    """The torch.Generator seed of noise row j: the first 8 bytes (big-endian, top bit cleared) of
    SHA-256 of ``"mfcli-torch-noise|<seed>|<j>"``; Z[j] = ``torch.randn(d, generator=g)`` on the
    device after ``g.manual_seed(torch_seed(seed, j))``."""
    digest = hashlib.sha256(f"mfcli-torch-noise|{int(seed)}|{int(j)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & (2**63 - 1)


class TorchOps:
    """:class:`mfcli.strategies.operators.ArrayOps` on torch tensors of one device, updating in place."""

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        self.device, self.dtype = device, dtype

    def zeros(self, rows: int, d: int) -> torch.Tensor:
        return torch.zeros((rows, d), device=self.device, dtype=self.dtype)

    def set_row(self, a: torch.Tensor, i: Any, value: torch.Tensor) -> torch.Tensor:
        a[i] = value
        return a

    def set_rows(self, a: torch.Tensor, start: int, values: torch.Tensor) -> torch.Tensor:
        target = a[start:start + values.shape[0]]
        if target.data_ptr() != values.data_ptr():   # not updated in place already
            target.copy_(values)
        return a

    def matvec(self, coef: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return coef @ rows

    def addmv(self, x: torch.Tensor, coef: torch.Tensor, rows: torch.Tensor, alpha: float) -> torch.Tensor:
        # one BLAS call that reads the k rows once and updates x in place (no product row, no sum)
        return x.addmv_(rows.t(), coef, alpha=alpha)

    def add_outer(self, a: torch.Tensor, coef: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
        return a.addcmul_(coef[:, None], row[None, :])

    def scale_add(self, a: torch.Tensor, scale: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
        # one pass over a (read, write) instead of two: a <- row + a * scale
        return torch.addcmul(row[None, :].expand_as(a), a, scale[:, None], out=a)

    def prefix_matvec(self, coef: torch.Tensor, rows: torch.Tensor, k: Any) -> torch.Tensor:
        k = int(k)
        return coef[:k] @ rows[:k]

    def fill_rows(self, a: torch.Tensor, lo: Any, hi: Any, draw: Callable[[Any], Any]) -> torch.Tensor:
        for j in range(int(lo), int(hi)):
            a[j] = draw(j)
        return a


class TorchStream:
    """A :class:`~mfcli.training.noise.NoiseStream` run on a torch device: Z[j] from a ``torch.Generator``
    on the device (:func:`torch_seed`), the stream's recursion on device tensors, its state on the
    device, checkpoints in the one mfcli format (generator ``torch-<device type>``).

    ``next()`` returns row t as a (d,) tensor on the device and advances; step n is refused.
    """

    def __init__(self, stream: NoiseStream, device: Any = "cpu") -> None:
        self.stream = stream
        self.device = torch.device(device)
        self.dtype = torch.float64 if stream.dtype == np.float64 else torch.float32
        self.ops = TorchOps(self.device, self.dtype)
        self.tables = cast_tables(stream.operator.tables(), lambda a: torch.as_tensor(a, device=self.device),
                                  stream.dtype)
        self.generator = torch.Generator(device=self.device)
        self.ring, self.running = self.ops.zeros(stream.width, stream.d), self.ops.zeros(stream.rank, stream.d)
        self.t = 0

    @property
    def generator_name(self) -> str:
        return f"torch-{self.device.type}"

    def draw(self, j: Any) -> torch.Tensor:
        self.generator.manual_seed(torch_seed(self.stream.seed, int(j)))
        return torch.randn(self.stream.d, generator=self.generator, device=self.device, dtype=self.dtype)

    @torch.no_grad()
    def next(self) -> torch.Tensor:
        t = check_step(self.t, self.stream.n)
        row, (self.ring, self.running) = self.stream.operator.step(t, self.draw, (self.ring, self.running),
                                                                  self.tables, self.ops)
        self.t = t + 1
        return row

    def generator_check(self, t: int) -> str:
        """Hash of the first entries of row max(t - 1, 0) as this device's generator draws it."""
        head = self.draw(max(t - 1, 0))[:16].cpu().numpy()
        return hashlib.sha256(head.tobytes()).hexdigest()

    def state_dict(self) -> dict:
        """The one mfcli checkpoint format, ``running`` as a CPU tensor (``weights_only`` loads)."""
        sd = self.stream.checkpoint(self.t, self.running.cpu().numpy(), generator=self.generator_name,
                                    generator_check=self.generator_check(self.t))
        sd["running"] = torch.from_numpy(np.ascontiguousarray(sd["running"]))
        return sd

    @torch.no_grad()
    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict` (checked: tag, identity, generator); the kept rows of
        Z are redrawn on the device."""
        t, running = self.stream.restore(_host_checkpoint(sd), generator=self.generator_name,
                                         generator_check=self.generator_check)
        ring = self.ops.zeros(self.stream.width, self.stream.d)
        for slot, j in self.stream.operator.kept_rows(t):
            ring[slot] = self.draw(j)
        self.ring, self.running, self.t = ring, torch.as_tensor(running, device=self.device), t


class _NumpyRows:
    """The numpy reference stream behind the same interface as :class:`TorchStream`."""

    def __init__(self, stream: NoiseStream) -> None:
        self.stream = stream
        self.state = stream.init()

    @property
    def t(self) -> int:
        return self.state.t

    def next(self) -> torch.Tensor:
        row, self.state = self.stream.next(self.state)
        return torch.from_numpy(row)

    def state_dict(self) -> dict:
        return noise_state_dict(self.stream, self.state)

    def load_state_dict(self, sd: Mapping[str, Any]) -> None:
        self.state = load_noise_state_dict(self.stream, sd)


class StreamFacts:
    """What an optimizer adding a :class:`~mfcli.training.noise.NoiseStream`'s rows reports about
    them, read from its ``stream``, ``record`` and ``noise_std``: shared by
    :class:`CorrelatedNoiseOptimizer` and :class:`mfcli.adapters.opacus.CorrelatedNoiseDPOptimizer`."""

    stream: NoiseStream
    noise_std: float

    @property
    def n(self) -> int:
        """Steps the artifact covers (and the accounting assumes); step n is refused."""
        return self.stream.n

    @property
    def sensitivity(self) -> float:
        """sens(C) (or sens(C^) compressed) per unit clip norm of the operator that runs: the
        number accounting must use."""
        return self.stream.sensitivity

    @property
    def accounted_operator(self) -> str:
        """The operator whose strategy the accounting of this training must use, as ``mfcli
        account`` names it (``dense`` or ``compressed (band K, rank R)``); ``account`` picks the
        same one by default, or pass ``--operator`` to match a ``variant`` given here."""
        return self.stream.accounted_operator

    @property
    def noise_multiplier(self) -> float | None:
        """noise_std / the record's accounted sensitivity (the noise multiplier of Opacus and
        jax_privacy); None without a record, whose sensitivity is not known here."""
        record = self.__dict__.get("record")   # read before __init__ has set it (Opacus does)
        return None if record is None else self.noise_std / float(record.sensitivity)


class CorrelatedNoiseOptimizer(StreamFacts, torch.optim.Optimizer):
    """Wraps a ``torch.optim`` optimizer; :meth:`step` first adds correlated gradient noise.

    It is a :class:`torch.optim.Optimizer` sharing the inner optimizer's ``param_groups``,
    ``state`` and ``defaults`` (as Opacus's DPOptimizer does), so learning-rate schedulers
    (``StepLR``, ``CosineAnnealingLR``, ...) drive the inner learning rate, step hooks
    (``register_step_pre_hook``/``register_step_post_hook``) run around :meth:`step`, and
    :meth:`state_dict` holds the whole training state: the inner optimizer's and the noise
    stream position (resume is bit-identical).

    Args:
        optimizer: the inner optimizer (it owns the parameters, learning rate and momentum).
        artifact: path to an mfcli artifact (or a loaded Artifact); or pass ``stream``.
        stream: a ready :class:`mfcli.training.noise.NoiseStream` of kind ``gradient`` whose ``d`` is the
            number of trainable parameters (instead of ``artifact``/``seed``/``variant``).
        seed: the secret noise seed, an integer in [0, 2^128) (keep it for resume).
        noise_std: the std of the noise on C G per unit clip norm; the noise added is
            ``noise_std * clip * (C^-1 Z)[t]`` (0.2's ``noise_multiplier``).
        noise_multiplier: noise_std / sensitivity; only with ``record=`` (module docstring, "Units").
        record: a verified :class:`mfcli.training.record.TrainingRecord`: the noise is its operator's
            at its noise std (``noise_std``/``noise_multiplier`` may be omitted; if given they must
            be the record's). Give ``seed`` with it, not ``artifact`` (the record names it).
        clip_norm: the per-example clip norm.
        batch_size: None if ``.grad`` holds the sum of clipped per-example gradients; B if it holds
            their average over a fixed batch of B (the noise is then divided by B too).
        variant: ``auto``, ``dense`` or ``compressed`` (see :func:`mfcli.training.noise.noise_stream`).
        dtype: noise dtype; default float64 if every parameter is float64, else float32.
        postprocess: optional ``f(flat_noisy_grad) -> tensor`` applied to the flattened noisy
            gradient (length d, parameter order) before the inner step; e.g. Laplacian smoothing.
        check_workload: warn if a ``torch.optim.SGD`` inner optimizer does not match the
            artifact's prefix/momentum workload.
        generator: ``auto`` (default: the numpy reference stream for CPU parameters, the torch
            generator on the device otherwise), ``numpy`` or ``torch`` (module docstring).

    Parameters are flattened in ``optimizer.param_groups`` order; parameter k takes entries
    [offset_k, offset_k + numel_k) of each noise row. A parameter whose ``.grad`` is None at a
    step is treated as having zero gradient: it still receives its noise.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        artifact: Any = None,
        stream: NoiseStream | None = None,
        seed: int | None = None,
        noise_std: float | None = None,
        noise_multiplier: float | None = None,
        record: Any = None,
        clip_norm: float,
        batch_size: int | None = None,
        variant: str = "auto",
        dtype: str | None = None,
        postprocess: Callable[[torch.Tensor], torch.Tensor] | None = None,
        check_workload: bool = True,
        generator: str = "auto",
    ) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise MfcliError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        refuse_noising_optimizer(optimizer, "CorrelatedNoiseOptimizer")
        params = self._collect(optimizer.param_groups)
        if not params:
            raise MfcliError("the optimizer has no trainable parameters")
        d = sum(p.numel() for p in params)
        std = resolve_noise_std(noise_std=noise_std, noise_multiplier=noise_multiplier, record=record)
        assert std is not None
        check_noise_options(noise_std=std, clip_norm=clip_norm, batch_size=batch_size, postprocess=postprocess)
        if record is not None:
            if artifact is not None:
                raise MfcliError("pass record= or artifact=, not both: the record names its artifact")
            if stream is None:
                if seed is None:
                    raise MfcliError("record= needs seed= (the secret noise seed)")
                stream = record_stream(record, d=d, seed=seed, dtype=dtype or _numpy_dtype_for(params))
                seed = None
            elif stream.n != record.n:
                raise MfcliError(f"the noise stream has n = {stream.n} steps but the record accounts {record.n}")
        if stream is None:
            if artifact is None or seed is None:
                raise MfcliError("pass either stream=, or artifact= and seed=")
            stream = noise_stream(
                artifact, kind="gradient", d=d, seed=seed,
                dtype=dtype or _numpy_dtype_for(params), variant=variant,
            )
        elif artifact is not None or seed is not None:
            raise MfcliError("pass either stream=, or artifact= and seed=, not both")
        check_gradient_stream(stream, "this optimizer")
        if stream.d != d:
            raise MfcliError(f"the noise stream has d = {stream.d} but the optimizer has {d} trainable parameters")
        if generator not in GENERATORS:
            raise MfcliError(f"generator must be one of {', '.join(GENERATORS)}, got {generator!r}")
        device = params[0].device
        if generator == "torch" or (generator == "auto" and device.type != "cpu"):
            self._noise: TorchStream | _NumpyRows = TorchStream(stream, device)
        else:
            self._noise = _NumpyRows(stream)
        self.optimizer = optimizer
        self.stream = stream
        #: the std of the noise on C G per unit clip norm that :meth:`step` adds (times clip)
        self.noise_std = float(std)
        #: the :class:`mfcli.training.record.TrainingRecord` the noise follows (None: no record)
        self.record = record
        self.clip_norm = float(clip_norm)
        self.batch_size = batch_size
        self.postprocess = postprocess
        self._params = params
        self._param_ids = tuple(id(p) for p in params)
        # What torch.optim.Optimizer.__init__ sets up, minus the parameter groups (shared with the
        # inner optimizer): the hook tables and the step wrapper that runs them.
        self._optimizer_step_pre_hooks: OrderedDict[int, Any] = OrderedDict()
        self._optimizer_step_post_hooks: OrderedDict[int, Any] = OrderedDict()
        self._optimizer_state_dict_pre_hooks: OrderedDict[int, Any] = OrderedDict()
        self._optimizer_state_dict_post_hooks: OrderedDict[int, Any] = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks: OrderedDict[int, Any] = OrderedDict()
        self._optimizer_load_state_dict_post_hooks: OrderedDict[int, Any] = OrderedDict()
        self._patch_step_function()
        if check_workload:
            self._check_workload()

    # ------------------------------------------------------------------ properties

    @property
    def steps_taken(self) -> int:
        """Noisy steps taken so far (the next step is this index)."""
        return self._noise.t

    @property
    def generator(self) -> str:
        """Where Z is drawn: ``numpy-philox`` (the host reference) or ``torch-<device type>``."""
        return self._noise.generator_name if isinstance(self._noise, TorchStream) else "numpy-philox"

    @property
    def noise_scale(self) -> float:
        """The factor applied to each unit noise row: noise_std * clip (/ batch_size)."""
        scale = self.noise_std * self.clip_norm
        return scale / self.batch_size if self.batch_size else scale

    # The inner optimizer owns these; schedulers and user code read and write them through here.
    param_groups = Forwarded[list]("optimizer", "param_groups", writable=True)
    state = Forwarded[Any]("optimizer", "state", writable=True)
    defaults = Forwarded[dict]("optimizer", "defaults", writable=True)

    # ------------------------------------------------------------------ optimizer interface

    def add_param_group(self, param_group: dict) -> None:
        """Refused: the noise stream's row length d is fixed at construction, and a parameter
        added later would be trained without noise."""
        raise MfcliError(
            "cannot add a parameter group to a CorrelatedNoiseOptimizer: its noise rows have d = "
            f"{self.stream.d}; build the inner optimizer with every parameter first"
        )

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As ``torch.optim.Optimizer.zero_grad``: ``.grad`` set to None (default) or zeroed in
        place (``set_to_none=False``); either way the next step adds its noise row."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Add ``noise_scale * (C^-1 Z)[t]`` to the gradients, then run the inner step.

        Raises MfcliError at t >= n, or when the inner optimizer's parameters changed since
        construction, before touching any gradient.
        """
        if tuple(id(p) for p in self._collect(self.optimizer.param_groups)) != self._param_ids:
            raise MfcliError(
                "the inner optimizer's trainable parameters changed since the CorrelatedNoiseOptimizer was built; "
                "its noise rows no longer cover them"
            )
        check_step(self._noise.t, self.stream.n)   # refuse step n before the closure or any gradient
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        noise = self._noise.next()
        scale = self.noise_scale
        if self.postprocess is None:
            for p, part in split_tensor(noise, self._params):
                if p.grad is None:
                    p.grad = part.mul(scale)
                else:
                    p.grad.add_(part, alpha=scale)
        else:
            flat = torch.cat(
                [
                    (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(noise.dtype).to(noise.device)
                    for p in self._params
                ]
            )
            flat.add_(noise, alpha=scale)
            out = self.postprocess(flat)
            if not isinstance(out, torch.Tensor) or out.shape != flat.shape:
                raise MfcliError(f"postprocess must return a tensor of shape {tuple(flat.shape)}")
            offset = 0
            for p in self._params:
                k = p.numel()
                p.grad = out[offset : offset + k].view_as(p).to(device=p.device, dtype=p.dtype).clone()
                offset += k
        self.optimizer.step()
        return loss

    def state_dict(self) -> dict:
        """The inner optimizer's state dict plus the noise stream's checkpoint (tensors and plain
        values only, so ``torch.load(weights_only=True)`` reads it). Keep it secret, like the seed."""
        return {"optimizer": self.optimizer.state_dict(), "noise": self._noise.state_dict()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore both; refuses a noise checkpoint of another seed, artifact, d or dtype."""
        if not isinstance(state_dict, Mapping) or "noise" not in state_dict or "optimizer" not in state_dict:
            raise MfcliError("not a CorrelatedNoiseOptimizer state dict (needs 'optimizer' and 'noise')")
        self._noise.load_state_dict(state_dict["noise"])
        self.optimizer.load_state_dict(state_dict["optimizer"])

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _collect(groups: Iterable[Mapping[str, Any]]) -> list[torch.Tensor]:
        seen: set[int] = set()
        out: list[torch.Tensor] = []
        for g in groups:
            for p in g["params"]:
                if p.requires_grad and id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def _check_workload(self) -> None:
        opt = self.optimizer
        name = self.stream.workload_name
        if not isinstance(opt, torch.optim.SGD) or name not in ("prefix", "momentum"):
            return
        beta = float(self.stream.workload_params.get("beta", 0.0)) if name == "momentum" else 0.0
        for g in opt.param_groups:
            mom, damp, nest = g.get("momentum", 0.0), g.get("dampening", 0.0), g.get("nesterov", False)
            if not math.isclose(mom, beta, abs_tol=1e-12) or damp != 0 or nest:
                warnings.warn(
                    f"the artifact's workload is {name} (beta = {beta:g}) but the SGD optimizer has "
                    f"momentum={mom:g}, dampening={damp:g}, nesterov={nest}: the noise will not "
                    "cancel as the factorization intends (accuracy, not privacy, suffers)",
                    UserWarning,
                    stacklevel=3,
                )
                return


__all__ = ["CorrelatedNoiseOptimizer", "TorchOps", "TorchStream", "refuse_noising_optimizer", "torch_seed"]
