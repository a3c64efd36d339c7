"""The BandMF primal in banded storage: the same problem and certificate as
:mod:`mfcli.optimize.multi_solver`, with O(n^2 b) work per iteration instead of O(n^3).

For min-separation b with k > 1 participations the feasible X = C^T C is b-banded (X_ij = 0 for
|i - j| >= b) with X_ii <= 1 (docs/multi-participation.md). Only the n b entries of the band are
free, so the iterate is kept in LAPACK's lower band storage (``band[d, j] = X[j + d, j]``) and

* f(X) = tr(A X^-1 A^T) = ||L^-1 A^T||_F^2 with the banded Cholesky factor L (LAPACK pbtrf,
  O(n b^2)) and one banded triangular solve with n right-hand sides (tbtrs, O(n^2 b));
* the gradient -X^-1 A^T A X^-1 is needed only on the band: with Z = X^-1 A^T (one more banded
  solve), the band of Z Z^T is n / b blocked products of b x n by n x 2b matrices (O(n^2 b));
* the L-BFGS metric D -> P(X D X) of the dense solver multiplies banded matrices (O(n b^2));
* once L-BFGS slows down, truncated Newton steps: CG on the band with Hessian-vector products
  X^-1 D M + M D X^-1 = V Z^T + Z V^T (V = X^-1 D Z, O(n^2 b)), preconditioned by the inverse of
  the Hessian with L^T M L replaced by its n / 8 largest and n / 16 smallest eigenpairs and the
  harmonic mean of the rest (:class:`_LowRankInverse`, O(n r (b + r)) per application, r = 3 n / 16).

When the workload's inverse K = A^-1 is banded (every built-in workload: prefix, momentum, with
or without learning rates), value, gradient and Hessian products go through Y = K^T X K instead:
f = tr(Y^-1), the gradient -P_band(K Y^-2 K^T), by selected inversion of the block-tridiagonal Y
in O(n (b + 2p)^2) (:mod:`mfcli.optimize.selected_inversion`, :class:`_FastOps`); the preconditioner's
N = L^-1 A^T A L^-T is then applied by banded solves and N^-1 = L^T K K^T L by banded products.
Otherwise (:class:`_DenseOps`) the O(n^2 b) operators above.

Without an ``x0`` the iterate starts from the optimum of the leading n / 2 steps (solved the
same way, recursively, to a loose certified gap), its band extended to n (:func:`coarse_start`),
instead of X = I: the L-BFGS phase then takes tens of iterations instead of hundreds.

The Frobenius inner product of two symmetric band matrices counts each off-diagonal entry twice,
so the iterates are those of the dense L-BFGS (up to round-off). The dual certificate is the dense
one, unchanged (:func:`mfcli.optimize.multi_structure.certify`: W = P(X^-1 A^T A X^-1) from the full product
Z Z^T, the singular values of A R), and it is computed only when the primal's own estimate (the
Newton decrement; in the L-BFGS phase a stall) says the gap is below the tolerance, because it
costs O(n^3) -- tens of iterations' worth at n = 2048, b = 64.
"""
from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from mfcli.errors import MfcliError
from mfcli.model.participation import MinSeparation
from mfcli.optimize.dense import Progress
from mfcli.optimize.lbfgs import Certificates, Memory, backtrack
from mfcli.optimize.multi_structure import Structure, certify
from mfcli.optimize.pcg import pcg

#: Iterations over which the decrease of f is compared with the tolerance before a certificate.
STALL_WINDOW = 10
#: Certify when f fell by less than STALL_FRACTION * tol * f over the window ...
STALL_FRACTION = 0.1
#: ... or after this many iterations without a certificate (progress reports, safety).
CERTIFY_EVERY = 200
#: Switch from L-BFGS to truncated Newton steps once f fell by less than this fraction over the
#: window (ill-conditioned workloads such as momentum need thousands of L-BFGS iterations).
NEWTON_DECREASE = 1e-3
#: Conjugate-gradient iterations at most per Newton step.
NEWTON_CG = 50
#: The Newton preconditioner keeps the r = n / PRECOND_RANK_DIVISOR (at least 32) largest
#: eigenpairs of N = L^T M L (:class:`_LowRankInverse`) ...
PRECOND_RANK_DIVISOR = 8
#: ... and its n / PRECOND_BOTTOM_DIVISOR (at least 16) smallest, found from N^-1 = L^T K K^T L
#: (banded when K = A^-1 is), and flattens the rest to their harmonic mean. Momentum n = 1024, 64
#: bands: 225 CG steps against 478 with the 256 largest flattened to the 257th (the previous
#: version); prefix 46 against 102 (docs/performance.md, "BandMF at n = 2048: the target met").
PRECOND_BOTTOM_DIVISOR = 16
#: Newton steps at least between two certificates (each is O(n^3), a few Newton steps' worth) ...
NEWTON_CERT_SPACING = 3
#: ... or one, once a certificate's gap came within this factor of the tolerance: Newton's
#: convergence is quadratic there, so the next step usually closes it (momentum n = 2048, 64 bands:
#: a gap of 4e-6 at tolerance 1e-6 went to 1e-9 in the three steps the spacing asked for).
NEWTON_CERT_NEAR = 100.0
#: Coarse-to-fine start (:func:`coarse_start`): the leading m = n // 2 steps are solved first, to
#: this certified gap, when m >= COARSE_MIN_N and m >= COARSE_MIN_RATIO * b (recursively).
COARSE_TOL = 1e-3
COARSE_MIN_N = 256
COARSE_MIN_RATIO = 4


def to_band(x: np.ndarray, bands: int) -> np.ndarray:
    """Lower band storage (bands x n) of a symmetric n x n matrix: ``band[d, j] = x[j + d, j]``."""
    n = x.shape[0]
    band = np.zeros((bands, n))
    for d in range(bands):
        band[d, : n - d] = np.diagonal(x, -d)
    return band


def from_band(band: np.ndarray) -> np.ndarray:
    """The symmetric n x n matrix of a lower band storage."""
    bands, n = band.shape
    x = np.zeros((n, n))
    idx = np.arange(n)
    for d in range(bands):
        x[idx[d:], idx[: n - d]] = band[d, : n - d]
        x[idx[: n - d], idx[d:]] = band[d, : n - d]
    return x


class _Banded:
    """f, its gradient on the band and the L-BFGS metric for one workload A and b bands."""

    def __init__(self, a: np.ndarray, bands: int) -> None:
        self.a_t = np.asfortranarray(a.T)
        self.n = a.shape[0]
        self.bands = bands
        self.w = np.full((bands, self.n), 2.0)
        self.w[0] = 1.0
        self.w[np.arange(bands)[:, None] + np.arange(self.n)[None, :] >= self.n] = 0.0  # outside the matrix
        self._block_index()

    def dot(self, p: np.ndarray, q: np.ndarray) -> float:
        """<P, Q>_F of the symmetric matrices stored as bands."""
        return float(np.einsum("ij,ij,ij->", self.w, p, q))

    def value(self, band: np.ndarray) -> tuple[float, tuple[np.ndarray, np.ndarray, np.ndarray] | None]:
        """f(X) and the factors (L's diagonal and subdiagonal blocks, L^-1 A^T) for :meth:`z`;
        (inf, None) if X is not numerically positive definite."""
        chol = self.cholesky(band)
        if chol is None:
            return math.inf, None
        ld, ll = chol
        y = np.zeros((self.nblocks * self.bands, self.n))
        y[: self.n] = self.a_t
        self.forward(ld, ll, y)
        val = float(np.einsum("ij,ij->", y, y))
        if not math.isfinite(val) or val <= 0:
            return math.inf, None
        return val, (ld, ll, y)

    def cholesky(self, band: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """X = L L^T (LAPACK pbtrf, O(n b^2)) as L's diagonal and subdiagonal b x b blocks (the
        padding rows of L are the identity); None if X is not numerically positive definite."""
        from scipy.linalg.lapack import dpbtrf

        lower, info = dpbtrf(band, lower=1)
        if info != 0:
            return None
        ld, ll = self.blocks(lower)
        ld = np.tril(ld)
        pad = np.arange(self.n, self.nblocks * self.bands)  # padding: identity rows of L
        ld[-1, pad - (self.nblocks - 1) * self.bands, pad - (self.nblocks - 1) * self.bands] = 1.0
        return ld, ll

    def forward(self, ld: np.ndarray, ll: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Solve L Y = R in place (R padded to a multiple of b rows): block forward substitution,
        L being block lower-bidiagonal; BLAS-3 work, O(n^2 b) for n right-hand sides."""
        import scipy.linalg

        b = self.bands
        for k in range(self.nblocks):
            rhs = y[k * b : (k + 1) * b]
            if k:
                rhs -= ll[k - 1] @ y[(k - 1) * b : k * b]
            y[k * b : (k + 1) * b] = scipy.linalg.solve_triangular(ld[k], rhs, lower=True, check_finite=False)
        return y

    def backward(self, ld: np.ndarray, ll: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Solve L^T Z = Y (block back substitution); returns Z."""
        import scipy.linalg

        b = self.bands
        z = np.empty_like(y)
        for k in reversed(range(self.nblocks)):
            rhs = y[k * b : (k + 1) * b]
            if k < self.nblocks - 1:
                rhs = rhs - ll[k].T @ z[(k + 1) * b : (k + 2) * b]
            z[k * b : (k + 1) * b] = scipy.linalg.solve_triangular(ld[k], rhs, lower=True, trans="T",
                                                                    check_finite=False)
        return z

    def z(self, factors: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
        """Z = X^-1 A^T (zero-padded to a multiple of b rows), so that X^-1 A^T A X^-1 = Z Z^T."""
        ld, ll, y = factors
        return self.backward(ld, ll, y)

    def hessian(self, factors: tuple[np.ndarray, np.ndarray, np.ndarray], z: np.ndarray, d: np.ndarray) -> np.ndarray:
        """The band of the Hessian of f at X in the band direction D: X^-1 D M + M D X^-1 with
        M = Z Z^T, i.e. V Z^T + Z V^T for V = X^-1 D Z (O(n^2 b))."""
        ld, ll, _ = factors
        b, nb = self.bands, self.nblocks
        dd, dl = self.blocks(d)
        zb = z.reshape(nb, b, self.n)
        u = dd @ zb  # U = D Z, block rows: D_(k,k-1) Z_(k-1) + D_kk Z_k + D_(k,k+1) Z_(k+1)
        u[1:] += dl @ zb[:-1]
        u[:-1] += np.swapaxes(dl, 1, 2) @ zb[1:]
        v = self.backward(ld, ll, self.forward(ld, ll, u.reshape(nb * b, self.n))).reshape(nb, b, self.n)
        zt, vt = np.swapaxes(zb, 1, 2), np.swapaxes(v, 1, 2)
        return self.unblock(v @ zt + zb @ vt, v[1:] @ zt[:-1] + zb[1:] @ vt[:-1])

    def band_of_gram(self, z: np.ndarray) -> np.ndarray:
        """The band of Z Z^T (lower band storage): its diagonal and subdiagonal b x b blocks."""
        zb = z.reshape(self.nblocks, self.bands, self.n)
        zt = np.swapaxes(zb, 1, 2)
        return self.unblock(zb @ zt, zb[1:] @ zt[:-1])

    def blocks(self, band: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The b-banded symmetric matrix as a block-tridiagonal one with b x b blocks (zero-padded
        to a multiple of b): (diagonal blocks S_kk, subdiagonal blocks S_(k+1)k)."""
        b, nb = self.bands, self.nblocks
        pad = np.zeros((b, nb * b + 1))  # the last column stays zero: the target of masked indices
        pad[:, : self.n] = band
        return pad.ravel()[self._diag_idx], pad.ravel()[self._low_idx]

    def unblock(self, diag: np.ndarray, low: np.ndarray) -> np.ndarray:
        """Lower band storage of the band part of a block-tridiagonal symmetric matrix."""
        b, nb = self.bands, self.nblocks
        pad = np.zeros(b * (nb * b + 1))
        keep_d = self._diag_lower
        pad[self._diag_idx[:, keep_d]] = diag[:, keep_d]
        keep_l = self._low_upper
        pad[self._low_idx[:, keep_l]] = low[:, keep_l]
        return pad.reshape(b, nb * b + 1)[:, : self.n].copy()

    def _block_index(self) -> None:
        b, n = self.bands, self.n
        nb = -(-n // b)
        self.nblocks = nb
        width = nb * b + 1
        r, c = np.meshgrid(np.arange(b), np.arange(b), indexing="ij")
        k = np.arange(nb)[:, None, None]
        # S_kk[r, c] = band[|r - c|, k b + min(r, c)]
        self._diag_idx = np.abs(r - c)[None] * width + k * b + np.minimum(r, c)[None]
        self._diag_lower = r >= c
        # S_(k+1)k[r, c] = X[(k+1) b + r, k b + c], offset b + r - c: in the band iff r < c.
        d = b + r - c
        low = np.where((d < b)[None], np.minimum(d, b - 1)[None] * width + k[: max(nb - 1, 0)] * b + c[None], width - 1)
        self._low_idx = low
        self._low_upper = r < c

    def bmul(self, sb: tuple[np.ndarray, np.ndarray], w: np.ndarray) -> np.ndarray:
        """S W for the block-tridiagonal symmetric S (:meth:`blocks`) and W with nblocks * b rows."""
        sd, sl = sb
        wb = w.reshape(self.nblocks, self.bands, -1)
        out = sd @ wb
        out[1:] += sl @ wb[:-1]
        out[:-1] += np.swapaxes(sl, 1, 2) @ wb[1:]
        return out.reshape(w.shape)

    def lmul(self, ld: np.ndarray, ll: np.ndarray, w: np.ndarray) -> np.ndarray:
        """L W for the block lower-bidiagonal Cholesky factor L (:meth:`value`)."""
        wb = w.reshape(self.nblocks, self.bands, -1)
        out = ld @ wb
        out[1:] += ll @ wb[:-1]
        return out.reshape(w.shape)

    def ltmul(self, ld: np.ndarray, ll: np.ndarray, w: np.ndarray) -> np.ndarray:
        """L^T W for the block lower-bidiagonal Cholesky factor L (:meth:`value`)."""
        wb = w.reshape(self.nblocks, self.bands, -1)
        out = np.swapaxes(ld, 1, 2) @ wb
        out[:-1] += np.swapaxes(ll, 1, 2) @ wb[1:]
        return out.reshape(w.shape)

    def band_sym(self, p: np.ndarray, q: np.ndarray) -> np.ndarray:
        """The band of P Q^T + Q P^T for P, Q with nblocks * b rows."""
        pb = p.reshape(self.nblocks, self.bands, -1)
        qb = q.reshape(self.nblocks, self.bands, -1)
        pt, qt = np.swapaxes(pb, 1, 2), np.swapaxes(qb, 1, 2)
        diag = pb @ qt
        diag += np.swapaxes(diag, 1, 2)  # (Q P^T)_kk = ((P Q^T)_kk)^T: one product instead of two
        return self.unblock(diag, pb[1:] @ qt[:-1] + qb[1:] @ pt[:-1])

    def metric(self, xb: tuple[np.ndarray, np.ndarray], q: np.ndarray) -> np.ndarray:
        """The band of X Q X (the affine-invariant metric) by batched b x b block products; X
        given by :meth:`blocks`."""
        xd, xl = xb
        qd, ql = self.blocks(q)
        nb = self.nblocks
        zero = np.zeros((1, *xd.shape[1:]))

        def sub(dg: np.ndarray, lw: np.ndarray, off: int) -> np.ndarray:
            """S_(k, k + off) for k = 0..nb-1 (zero outside the matrix)."""
            if off == 0:
                return dg
            if off == -1:
                return np.concatenate([zero, lw])
            if off == 1:
                return np.concatenate([np.swapaxes(lw, 1, 2), zero])
            return np.zeros_like(dg)

        def shift(st: np.ndarray, e: int) -> np.ndarray:
            """st[k + e] (zero outside)."""
            if e == 0:
                return st
            out = np.zeros_like(st)
            if e > 0:
                out[: nb - e] = st[e:]
            else:
                out[-e:] = st[: nb + e]
            return out

        xs = {e: sub(xd, xl, e) for e in (-1, 0, 1)}
        qs = {e: sub(qd, ql, e) for e in (-1, 0, 1)}
        t = {}
        for o in (-2, -1, 0, 1):  # T = X Q: T_(k, k + o)
            t[o] = sum(xs[e] @ shift(qs[o - e], e) for e in (-1, 0, 1) if abs(o - e) <= 1)
        rd = sum(t[e] @ shift(xs[-e], e) for e in (-1, 0, 1))
        rl = sum(shift(t[e - 1], 1) @ shift(xs[-e], e) for e in (-1, 0, 1))[: nb - 1]
        return self.unblock(rd, rl)


def solve_banded(
    a: np.ndarray, st: Structure, *, tol: float, max_iter: int,
    callback: Callable[[Progress], None] | None, x0: np.ndarray | None, memory: int, fast: bool = True,
    start_band: np.ndarray | None = None,
) -> tuple[np.ndarray, float, int, list[Progress]]:
    """L-BFGS, then truncated Newton, over the band of X (BandMF, k > 1). Returns (X dense, best
    dual bound of f, iterations, history); the caller builds and re-verifies the result from X.
    ``fast``: value, gradient and Hessian products by selected inversion
    (:mod:`mfcli.optimize.selected_inversion`, O(n w^2)) when A^-1 is banded; speed only.
    ``start_band``: a starting X in band storage (:func:`coarse_start`) when no ``x0`` is given;
    it is rescaled to diag(X) = 1 and used only if it is positive definite with f below the
    diagonal start's (else the diagonal start); speed only."""
    bands = st.bands
    prob = _Banded(a, bands)
    ops = _operators(a, prob, fast)
    x = to_band(st.normalize(np.array(x0, dtype=np.float64)), bands) if x0 is not None else to_band(st.start(), bands)
    start = time.perf_counter()
    f, factors = ops.value(x)
    if factors is None:
        raise MfcliError("the starting X is not positive definite")
    if x0 is None and start_band is not None:
        warm = unit_diagonal(start_band)
        f_warm, warm_factors = ops.value(warm)
        if warm_factors is not None and f_warm < f:
            x, f, factors = warm, f_warm, warm_factors
    g = ops.gradient(factors)
    g[0] = 0.0  # tangent: each diagonal entry is its own class (fixed at 1)
    pairs = Memory(memory, prob.dot)
    certs = Certificates(st.scale, callback, start)
    values = [f]
    last_cert = 0
    last_gap = math.inf
    newton, dec0 = False, None
    basis: np.ndarray | None = None
    it = 0
    for it in range(1, max_iter + 1):
        if not newton and len(values) > STALL_WINDOW and values[-1 - STALL_WINDOW] - f <= NEWTON_DECREASE * f:
            newton = True
        xs = prob.blocks(x)
        if newton:
            # CG forcing term from the metric norm of g relative to the switch (superlinear).
            dec = math.sqrt(max(prob.dot(g, prob.metric(xs, g)), 0.0))
            dec0 = dec if dec0 is None else dec0
            lr = ops.preconditioner(x, factors, xs, basis)
            basis = lr.basis
            d = _newton(prob, functools.partial(ops.hessian, factors), g, min(0.5, math.sqrt(dec / dec0)), lr)
            # -<g, d> / 2 (half the squared Newton decrement) estimates f - f*: certify once it
            # says the gap is well below tol, instead of after every step (each certificate is
            # O(n^3), several Newton steps' worth).
            spacing = 1 if last_gap <= NEWTON_CERT_NEAR * tol else NEWTON_CERT_SPACING
            due = -prob.dot(g, d) <= 2 * STALL_FRACTION * tol * f and it - last_cert >= spacing
        else:
            d = _lbfgs_direction(prob, pairs, g, xs)
            stalled = len(values) > STALL_WINDOW and values[-1 - STALL_WINDOW] - f <= STALL_FRACTION * tol * f
            due = stalled and it - last_cert >= max(STALL_WINDOW, it // 4)
        if due or it - last_cert >= CERTIFY_EVERY:
            last_cert = it
            method = "newton-band-storage" if newton else "lbfgs-band-storage"
            last_gap = certs.record(it, f, certify(a, st, ops.gram(x, factors)), method)
            if last_gap <= tol:
                break
        slope = prob.dot(g, d)
        if slope >= 0:
            pairs.clear()
            d = -g * (0.1 / max(float(np.abs(g).max()), 1e-300))
            slope = prob.dot(g, d)
        found = backtrack(ops.value, x, d, f, slope)
        if found is None:
            break  # the round-off floor
        x_new, f_new, new_factors = found
        g_new = ops.gradient(new_factors)
        g_new[0] = 0.0
        pairs.push(x_new - x, g_new - g)
        x, f, g, factors = x_new, f_new, g_new, new_factors
        values.append(f)
    if last_cert != it or not certs.history:
        method = "newton-band-storage" if newton else "lbfgs-band-storage"
        certs.record(it, f, certify(a, st, ops.gram(x, factors)), method, report=False)
    return from_band(x), certs.best, it, certs.history


def coarse_start(
    a: np.ndarray, st: Structure, *, memory: int, fast: bool = True,
) -> tuple[np.ndarray | None, list[tuple[int, int]]]:
    """A starting band for the n-step problem from the (m = n // 2)-step one, and (m, iterations)
    per coarse level solved, coarsest first; (None, []) when m < COARSE_MIN_N or m < COARSE_MIN_RATIO * b.

    The leading m x m block of the lower-triangular A is the workload of the first m steps, a
    BandMF problem with the same b; it is solved to a certified gap of COARSE_TOL by
    :func:`solve_banded`, itself started from its own coarse problem. Its optimal band is
    Toeplitz-like away from both ends, so :func:`extend_band` keeps the first and last m / 2
    columns and repeats the middle one. Why: from the diagonal start L-BFGS spends most of its
    iterations finding this shape (prefix n = 2048 took 164 iterations in all).
    The result is only a start: :func:`solve_banded` checks it (positive definite, f below the
    diagonal start's) and certifies the n-step problem as before."""
    n, bands = st.n, st.bands
    m = n // 2
    if m < COARSE_MIN_N or m < COARSE_MIN_RATIO * bands:
        return None, []
    sub = Structure(m, MinSeparation(separation=bands))  # m > b: more than one participation
    lead = a[:m, :m]
    inner, levels = coarse_start(lead, sub, memory=memory, fast=fast)
    x, _, it, _ = solve_banded(lead, sub, tol=COARSE_TOL, max_iter=10_000, callback=None, x0=None, memory=memory,
                               fast=fast, start_band=inner)
    return extend_band(to_band(x, bands), n), [*levels, (m, it)]


def extend_band(band: np.ndarray, n: int) -> np.ndarray:
    """The band (b x m storage) of an m-step X stretched to n >= m steps: its first m // 2 and last
    m - m // 2 columns at both ends, its middle column repeated in between (entries outside the
    n x n matrix stay zero when b <= m // 2)."""
    bands, m = band.shape
    h = m // 2
    out = np.empty((bands, n))
    out[:, :h] = band[:, :h]
    out[:, h : n - (m - h)] = band[:, h : h + 1]
    out[:, n - (m - h) :] = band[:, h:]
    return out


def unit_diagonal(band: np.ndarray) -> np.ndarray:
    """D^-1/2 X D^-1/2 (D = diag X) in band storage: diag 1, positive definite iff X is."""
    bands, n = band.shape
    s = 1.0 / np.sqrt(band[0])
    out = band.copy()
    for d in range(bands):
        out[d, : n - d] *= s[: n - d] * s[d:]
    return out


def _newton(
    prob: _Banded, hessian: Callable[[np.ndarray], np.ndarray], g: np.ndarray, eta: float, lr: _LowRankInverse,
) -> np.ndarray:
    """A truncated Newton direction: preconditioned CG on P(H[d]) = -g over the band directions
    that keep the diagonal fixed, preconditioned by ``lr`` (:class:`_LowRankInverse`; the metric
    P(X . X), its r = 0 case, made CG run to its cap on ill-conditioned workloads such as momentum)."""

    def hess(p: np.ndarray) -> np.ndarray:
        h = hessian(p)
        h[0] = 0.0
        return h

    def precond(r: np.ndarray) -> np.ndarray:
        q = lr(r)
        q[0] = 0.0
        return q

    return pcg(hess, precond, -g, rtol=eta, max_steps=NEWTON_CG, dot=prob.dot).solution


def _lbfgs_direction(prob: _Banded, pairs: Memory, g: np.ndarray, xs: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """The L-BFGS direction of the dense solver (:func:`mfcli.optimize.multi_solver._lbfgs_direction`: the
    metric D -> P(X D X) as initial inverse Hessian), in band storage."""

    def h0(q: np.ndarray) -> np.ndarray:
        r = prob.metric(xs, q)
        r[0] = 0.0
        return r

    # gamma's denominator <y, P(X y X)> = tr(Y X Y X) for the tangent y: h0 itself in band storage.
    return pairs.direction(g, h0, lambda y: prob.dot(y, h0(y)), lambda r: 0.1 / max(float(np.abs(r).max()), 1e-300))


def _rank(n: int) -> int:
    """r of the Newton preconditioner (:class:`_LowRankInverse`): its largest eigenpairs of N."""
    return min(n - 1, max(32, n // PRECOND_RANK_DIVISOR))


def _bottom(n: int) -> int:
    """The Newton preconditioner's smallest eigenpairs of N (:class:`_LowRankInverse`)."""
    return max(16, n // PRECOND_BOTTOM_DIVISOR)


class _LowRankInverse:
    """The inverse of the unconstrained Hessian of f at X with L^T M L = N replaced by
    N_r = c (I - Q Q^T) + Q diag(l) Q^T, applied to band matrices in O(n r (b + r)).

    With X = L L^T and D = L Y L^T, H[D] = X^-1 D M + M D X^-1 becomes L^-T (Y N + N Y) L^-1, so
    the inverse solves a Lyapunov equation in N; with N_r it is explicit: on the complement of Q
    Y = G'/(2c), across Q and its complement G'/(l_i + c), on Q G'/(l_i + l_j) (G' = L^T G L).
    Mapped back, H_r^-1[G] = X G X / (2c) + low-rank terms in W = L Q.

    Q holds the ``rank`` largest eigenpairs of N = (L^-1 A^T)(L^-1 A^T)^T (a randomized range
    finder, O(n^2 r), or O(n r (b + p)) with ``apply_n`` when A^-1 is banded: N = L^-1 K^-T K^-1
    L^-T by banded solves) and, given ``apply_ninv`` (N^-1 = L^T K K^T L, banded products), its
    ``bottom`` smallest (the largest of N^-1, orthogonalised against the first ones). c is the
    harmonic mean of the eigenvalues left out, (n - r) / (tr(N^-1) - sum 1 / l_i), when
    ``ninv_trace`` = tr(N^-1) = tr(K^T X K) is given, else the largest eigenvalue left out.
    Why: N's spectrum spans 5-6 decades for momentum; the Hessian's eigenvalues l_i + l_j on
    the flattened part are replaced by 2c, so the preconditioned ones there range over
    [l_min / c, l_r / c]: the old c = l_(r+1) put all of them below 1, down to ~1e-3, while most
    of the eigenvalues left out lie near the bottom of that range; the harmonic mean centres
    them, and taking the smallest eigenpairs out narrows the range itself (CG steps: momentum
    n = 1024 478 -> 225 with half the rank; docs/performance.md).

    Symmetric positive definite on the band for any orthonormal Q, l > 0 and c > 0: N_r is then
    symmetric positive definite, so H_r (a Hessian of the same form) is self-adjoint and positive
    definite and so is its inverse, whose quadratic form on band matrices is unchanged by keeping
    only the band of its output; hence a valid CG preconditioner (it changes the speed of CG,
    never the Newton system). With r = n - 1, or with the r largest and n - 1 - r smallest and the
    exact trace, N_r = N and it is the dense solver's exact inverse Hessian.
    """

    def __init__(self, prob: _Banded, factors: tuple[np.ndarray, ...],
                 xs: tuple[np.ndarray, np.ndarray], rank: int, seed: int = 0,
                 start: np.ndarray | None = None,
                 apply_n: Callable[[np.ndarray], np.ndarray] | None = None,
                 apply_ninv: Callable[[np.ndarray], np.ndarray] | None = None, bottom: int = 0,
                 ninv_trace: float | None = None) -> None:
        import scipy.linalg

        ld, ll = factors[0], factors[1]
        n = prob.n
        self.prob, self.xs = prob, xs
        if apply_n is None:
            yy = factors[2][:n]  # L^-1 A^T: N = yy yy^T

            def apply_n(v: np.ndarray) -> np.ndarray:
                return yy @ (yy.T @ v)

        r = min(rank, n - 1)
        p = min(r + 10, n)
        # The smallest eigenpairs: pb candidates in the complement of the r largest (at most n - r).
        pb = min(bottom + 10, n - r) if apply_ninv is not None and bottom > 0 else 0
        rb = min(bottom, pb, n - 1 - r)
        start_b = None
        if start is not None and pb and start.shape == (n, p + pb):
            start, start_b = start[:, :p], start[:, p:]
        if start is not None and start.shape == (n, p):
            # The previous Newton step's basis: N moved little, one power iteration refines it.
            q = np.linalg.qr(apply_n(start))[0]
        else:
            rng = np.random.default_rng(seed)
            q = np.linalg.qr(apply_n(rng.standard_normal((n, p))))[0]
            for _ in range(2):  # power iterations: the spectrum decays slowly
                q = np.linalg.qr(apply_n(q))[0]
        lam, u = scipy.linalg.eigh(q.T @ apply_n(q), check_finite=False)
        lam, u = lam[::-1], u[:, ::-1]
        self.basis = q @ u  # Ritz vectors, largest first: the next step's start
        self.c = float(max(lam[r], 1e-300))
        self.lam = lam[:r]
        qr = q @ u[:, :r]
        if rb > 0:
            assert apply_ninv is not None
            if start_b is not None:
                qb = np.linalg.qr(apply_ninv(start_b))[0]
            else:
                rng = np.random.default_rng(seed + 1)
                qb = np.linalg.qr(apply_ninv(rng.standard_normal((n, pb))))[0]
                for _ in range(2):
                    qb = np.linalg.qr(apply_ninv(qb))[0]
            for _ in range(2):  # orthogonal to the largest (twice: classical Gram-Schmidt)
                qb = np.linalg.qr(qb - qr @ (qr.T @ qb))[0]
            mu, ub = scipy.linalg.eigh(qb.T @ apply_ninv(qb), check_finite=False)
            vb = qb @ ub[:, ::-1]  # largest eigenvalues of N^-1 first
            self.basis = np.concatenate([self.basis, vb], axis=1)
            qr = np.concatenate([qr, vb[:, :rb]], axis=1)
            self.lam = np.concatenate([self.lam, 1.0 / np.maximum(mu[::-1][:rb], 1e-300)])
        if ninv_trace is not None and n > len(self.lam):
            rest = ninv_trace - float(np.sum(1.0 / self.lam))  # sum of 1 / eigenvalue left out
            if math.isfinite(rest) and rest > 0:
                self.c = (n - len(self.lam)) / rest
        self.q = qr
        w = np.zeros((prob.nblocks * prob.bands, qr.shape[1]))
        w[:n] = qr
        self.w = prob.lmul(ld, ll, w)  # W = L Q
        self.e = 1.0 / (self.lam[:, None] + self.lam[None, :]) - 0.5 / self.c
        self.f = 1.0 / (self.lam + self.c) - 0.5 / self.c

    def __call__(self, g: np.ndarray) -> np.ndarray:
        prob, w = self.prob, self.w
        gb = prob.blocks(g)
        gw = prob.bmul(gb, w)  # G W
        rq = w.T @ gw  # Q^T G' Q = W^T G W
        # W (E o Rq) / 2 + (X G W - W Rq) diag(F), with the two products by W merged (two n x r x r
        # products per application instead of three: they dominate at r = n / 4).
        p2 = w @ (0.5 * self.e * rq - rq * self.f[None, :]) + prob.bmul(self.xs, gw) * self.f[None, :]
        out = prob.metric(self.xs, g) * (0.5 / self.c) + prob.band_sym(w, p2)
        return out


class _DenseOps:
    """Value, gradient, Hessian products, certificate input and Newton preconditioner of the
    O(n^2 b) band-storage path (any workload). The state of an iterate is [factors, Z or None].
    The preconditioner's N^-1 = L^T (A^T A)^-1 L uses (A^T A)^-1 = A^-1 A^-T, formed once
    (O(n^3), like one certificate); without it (not finite) only N's largest eigenpairs are kept."""

    def __init__(self, prob: _Banded) -> None:
        self.prob = prob
        self._ata_inv: np.ndarray | None = None
        self._ata_band: np.ndarray | None = None

    def value(self, x: np.ndarray) -> tuple[float, Any]:
        f, factors = self.prob.value(x)
        return f, (None if factors is None else [factors, None])

    def _z(self, state: Any) -> np.ndarray:
        if state[1] is None:
            state[1] = self.prob.z(state[0])
        return state[1]

    def gradient(self, state: Any) -> np.ndarray:
        return -self.prob.band_of_gram(self._z(state))

    def hessian(self, state: Any, d: np.ndarray) -> np.ndarray:
        return self.prob.hessian(state[0], self._z(state), d)

    def gram(self, x: np.ndarray, state: Any) -> np.ndarray:
        return _gram(self._z(state), self.prob.n)

    def preconditioner(self, x: np.ndarray, state: Any, xs: tuple[np.ndarray, np.ndarray],
                       basis: np.ndarray | None) -> _LowRankInverse:
        import scipy.linalg

        prob, n = self.prob, self.prob.n
        if self._ata_inv is None:
            k = scipy.linalg.solve_triangular(prob.a_t, np.eye(n), lower=False, trans="T", check_finite=False)
            kkt = k @ k.T  # (A^T A)^-1
            if np.all(np.isfinite(kkt)):
                self._ata_inv, self._ata_band = kkt, to_band(kkt, prob.bands)
        if self._ata_inv is None or self._ata_band is None:
            return _LowRankInverse(prob, state[0], xs, _rank(n), start=basis)
        ld, ll = state[0][0], state[0][1]
        rows, ata_inv = prob.nblocks * prob.bands, self._ata_inv

        def apply_ninv(v: np.ndarray) -> np.ndarray:
            pad = np.zeros((rows, v.shape[1]))
            pad[:n] = v
            u = ata_inv @ prob.lmul(ld, ll, pad)[:n]
            pad = np.zeros((rows, v.shape[1]))
            pad[:n] = u
            return prob.ltmul(ld, ll, pad)[:n]  # L^T (A^T A)^-1 L V

        # tr(N^-1) = tr(X (A^T A)^-1): only the band of (A^T A)^-1 meets X's.
        return _LowRankInverse(prob, state[0], xs, _rank(n), start=basis, apply_ninv=apply_ninv,
                               bottom=_bottom(n), ninv_trace=prob.dot(x, self._ata_band))


class _FastOps:
    """The same operators when A^-1 = K is banded: value, gradient and Hessian products by
    selected inversion of Y = K^T X K (:class:`mfcli.optimize.selected_inversion.FastBandObjective`,
    O(n w^2)); the preconditioner's N = L^-1 A^T A L^-T applied by banded solves with L and K.
    The certificate input X^-1 A^T A X^-1 is formed densely by the O(n^2 b) path, as before;
    the preconditioner's N^-1 = L^T K K^T L is banded, so its smallest eigenpairs and the trace
    tr(N^-1) = tr(K^T X K) cost O(n r (b + p)) and O(n p^2)."""

    def __init__(self, prob: _Banded, k_band: np.ndarray) -> None:
        from mfcli.optimize.selected_inversion import FastBandObjective

        self.prob = prob
        self.obj = FastBandObjective(k_band, prob.bands, prob.n)
        self.k_low = k_band  # solve_banded's (p, 0) storage is LAPACK's lower band storage
        p, n = k_band.shape[0] - 1, prob.n
        self.k_up = np.zeros_like(k_band)  # K^T in solve_banded's (0, p) storage
        for d in range(p + 1):
            self.k_up[p - d, d:] = k_band[d, : n - d]
        self.p = p

    def value(self, x: np.ndarray) -> tuple[float, Any]:
        return self.obj.value(x)

    def gradient(self, state: Any) -> np.ndarray:
        return self.obj.gradient(state)

    def hessian(self, state: Any, d: np.ndarray) -> np.ndarray:
        return self.obj.hessian(state, d)

    def gram(self, x: np.ndarray, state: Any) -> np.ndarray:
        factors = self.prob.value(x)[1]
        if factors is None:
            raise MfcliError("the iterate lost positive definiteness")  # cannot happen: f was finite
        return _gram(self.prob.z(factors), self.prob.n)

    def preconditioner(self, x: np.ndarray, state: Any, xs: tuple[np.ndarray, np.ndarray],
                       basis: np.ndarray | None) -> _LowRankInverse:
        import scipy.linalg

        prob = self.prob
        chol = prob.cholesky(x)
        if chol is None:
            raise MfcliError("the iterate lost positive definiteness")
        ld, ll = chol
        n, rows = prob.n, prob.nblocks * prob.bands

        def apply_n(v: np.ndarray) -> np.ndarray:
            pad = np.zeros((rows, v.shape[1]))
            pad[:n] = v
            u = prob.backward(ld, ll, pad)[:n]  # L^-T V
            u = scipy.linalg.solve_banded((self.p, 0), self.k_low, u, check_finite=False)  # A u = K^-1 u
            u = scipy.linalg.solve_banded((0, self.p), self.k_up, u, check_finite=False)  # A^T: K^-T
            pad = np.zeros((rows, v.shape[1]))
            pad[:n] = u
            return prob.forward(ld, ll, pad)[:n]  # L^-1

        def apply_ninv(v: np.ndarray) -> np.ndarray:
            pad = np.zeros((rows, v.shape[1]))
            pad[:n] = v
            u = _kmul(self.k_low, prob.lmul(ld, ll, pad)[:n], transpose=True)  # K^T L V
            pad = np.zeros((rows, v.shape[1]))
            pad[:n] = _kmul(self.k_low, u, transpose=False)
            return prob.ltmul(ld, ll, pad)[:n]  # L^T K K^T L V

        return _LowRankInverse(prob, (ld, ll), xs, _rank(n), start=basis, apply_n=apply_n,
                               apply_ninv=apply_ninv, bottom=_bottom(n), ninv_trace=_trace_ktxk(self.k_low, x))


def _trace_ktxk(k_band: np.ndarray, band: np.ndarray) -> float:
    """tr(K^T X K) = sum_j sum_(d, e) K[j + d, j] X[j + d, j + e] K[j + e, j] for K lower-banded
    (``k_band[d, j] = K[j + d, j]``) and X in lower band storage, in O(n p^2)."""
    kb, n = k_band.shape[0], band.shape[1]
    total = 0.0
    for d in range(kb):
        for e in range(kb):
            off, low = abs(d - e), min(d, e)
            if off >= band.shape[0]:
                continue
            m = n - max(d, e)  # columns j with j + max(d, e) < n
            total += float(np.sum(k_band[d, :m] * k_band[e, :m] * band[off, low: low + m]))
    return total


def _kmul(k_band: np.ndarray, u: np.ndarray, transpose: bool) -> np.ndarray:
    """K U, or K^T U, for K lower-banded in lower band storage (``k_band[d, j] = K[j + d, j]``)."""
    n = u.shape[0]
    out = k_band[0][:, None] * u
    for d in range(1, k_band.shape[0]):
        if transpose:  # (K^T U)[j] += K[j + d, j] U[j + d]
            out[: n - d] += k_band[d, : n - d, None] * u[d:]
        else:  # (K U)[j + d] += K[j + d, j] U[j]
            out[d:] += k_band[d, : n - d, None] * u[: n - d]
    return out


def _operators(a: np.ndarray, prob: _Banded, fast: bool) -> _DenseOps | _FastOps:
    """The fast operators when ``fast`` and A^-1 is banded (:func:`mfcli.optimize.selected_inversion.banded_inverse`),
    else the O(n^2 b) ones."""
    if fast:
        from mfcli.optimize.selected_inversion import banded_inverse

        k_band = banded_inverse(a)
        if k_band is not None:
            return _FastOps(prob, k_band)
    return _DenseOps(prob)


def _gram(z: np.ndarray, n: int) -> np.ndarray:
    """The full X^-1 A^T A X^-1 = Z Z^T (for the certificate), from the padded Z."""
    from scipy.linalg.blas import dsyrk

    zz = np.asfortranarray(z[:n])
    upper = dsyrk(1.0, zz, lower=0)
    return np.triu(upper) + np.triu(upper, 1).T
