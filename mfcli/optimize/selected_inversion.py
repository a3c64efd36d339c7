"""tr(Y^-1), the band of Y^-2 and its directional derivative for a block-tridiagonal SPD Y, in
O(n w^2): the BandMF objective when the workload has a banded inverse.

Every built-in workload A has a banded inverse K = A^-1 (prefix: K = I - S with S the shift;
momentum with learning rates eta: K = (I - beta S) diag(1 / eta) (I - S), lower bandwidth 2).
Then for the b-banded X of BandMF

    f(X) = tr(A X^-1 A^T) = tr(Y^-1),  Y = K^T X K  (symmetric, half-bandwidth b - 1 + 2p),

because X^-1 = K Y^-1 K^T and A K = I; the gradient is -K Y^-2 K^T and only its band is needed.
Y is partitioned into N blocks of size w >= b + 2p (padded with identity rows, which add exactly
one per padded row to tr(Y^-1)), so it is block-tridiagonal. With S_0 = Y_00,
S_(i+1) = Y_(i+1,i+1) - Y_(i+1,i) S_i^-1 Y_(i+1,i)^T (block Cholesky), T_i = -Y_(i+1,i) S_i^-1 and
Z = Y^-1 (selected inversion, Takahashi's recurrence):

    Z_(N-1) = S_(N-1)^-1,  Z_i = S_i^-1 + T_i^T Z_(i+1) T_i,  Z_(i+1,i) = Z_(i+1) T_i,
    P_0 = 0, P_i = T_(i-1) (I + P_(i-1)) T_(i-1)^T      (forward)
    Q_(N-1) = 0, Q_i = T_i^T (Z_(i+1)^2 + Q_(i+1)) T_i     (backward)
    (Y^-2)_ii = Z_i P_i Z_i + Z_i^2 + Q_i,
    (Y^-2)_(i+1,i) = Z_(i+1) T_i (I + P_i) Z_i + (Z_(i+1)^2 + Q_(i+1)) T_i.

(Z_(i,j) = Z_i T_(i-1) ... T_j below the diagonal, so P_i and Q_i sum the contributions of the
blocks before and after i to (Z Z)_ii in closed form.) :func:`tangent` is the forward-mode
derivative of the same recurrence in a direction E of Y, which gives the Hessian-vector product
of f: -d(Y^-2)[E] = Z E Z^2 + Z^2 E Z. Every step is a w x w block product, so value and
gradient cost O(N w^3) = O(n w^2) against O(n^2 b) for a banded solve with n right-hand sides.

:func:`banded_inverse` finds K from A (one triangular solve, O(n^3) once per solve) and checks
it; custom workloads without a banded inverse get None and the caller keeps the O(n^2 b) path.
Nothing here bears on privacy: the solver's certificate and the caller's re-verification of the
returned X are dense and independent of this module.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Entries of A^-1 at most this fraction of its largest entry count as zero when its band is found.
BAND_RTOL = 1e-13
#: A^-1 counts as banded only with at most this many subdiagonals.
MAX_INVERSE_BANDWIDTH = 16
#: Accept the truncated K only if max |A K - I| is at most this.
RESIDUAL_TOL = 1e-9


def banded_inverse(a: np.ndarray) -> np.ndarray | None:
    """K = A^-1 in lower band storage (``k[d, j] = K[j + d, j]``, p + 1 rows) when the inverse
    of the lower-triangular A is banded with p <= ``MAX_INVERSE_BANDWIDTH`` subdiagonals, checked
    by max |A K - I| <= ``RESIDUAL_TOL`` for the truncated K; else None (no fast path).

    The first P + 1 diagonals of A^-1 depend only on the first P + 1 diagonals of A (forward
    substitution down each column), so K costs O(n P^2) and the check O(n^2 p), not a dense
    inverse."""
    a = np.asarray(a, dtype=np.float64)
    n = a.shape[0]
    if a.ndim != 2 or a.shape != (n, n) or n < 2 or not np.all(np.isfinite(a)):
        return None
    diag = np.diagonal(a)
    if np.any(diag == 0) or np.any(np.triu(a, 1) != 0):
        return None
    big = min(MAX_INVERSE_BANDWIDTH + 1, n - 1)  # diagonals computed: a wider inverse is refused
    kb = np.zeros((big + 1, n))
    kb[0] = 1.0 / diag
    adiag = [np.diagonal(a, -d) for d in range(big + 1)]
    with np.errstate(all="ignore"):
        for d in range(1, big + 1):
            # K[j + d, j] = -sum_m A[j + d, j + m] K[j + m, j] / A[j + d, j + d], m < d
            acc = np.zeros(n - d)
            for m in range(d):
                acc += adiag[d - m][m: m + n - d] * kb[m, : n - d]
            kb[d, : n - d] = -acc / diag[d:]
    if not np.all(np.isfinite(kb)):
        return None
    scale = float(np.abs(kb).max())
    wide = [d for d in range(big + 1) if float(np.abs(kb[d]).max()) > BAND_RTOL * scale]
    p = max(wide)
    if p > MAX_INVERSE_BANDWIDTH:
        return None
    kb = kb[: p + 1].copy()
    # A K - I column by column: (A K)[:, j] = sum_d A[:, j + d] K[j + d, j].
    prod = np.zeros((n, n))
    for d in range(p + 1):
        prod[:, : n - d] += a[:, d:] * kb[d, : n - d][None, :]
    prod[np.diag_indices(n)] -= 1.0
    if not float(np.abs(prod).max()) <= RESIDUAL_TOL:
        return None
    return kb


@dataclass
class Blocking:
    """The partition of n indices into N blocks of w (the last one padded with identity rows).

    :meth:`index` maps lower band storage (padded with one zero column) to the diagonal and
    subdiagonal blocks of a banded matrix (X's b rows, K's p + 1)."""

    n: int
    w: int
    nblocks: int

    @classmethod
    def make(cls, n: int, bands: int, kbands: int) -> Blocking:
        """Blocks of w = bands + 2 (kbands - 1), the least w for which Y = K^T X K (half-bandwidth
        bands - 1 + 2p, p = kbands - 1) is block-tridiagonal."""
        w = min(n, bands + 2 * (kbands - 1))
        return cls(n, w, -(-n // w))

    @property
    def npad(self) -> int:
        return self.nblocks * self.w

    def index(self, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Flat indices into a (rows, npad + 1) band array: diagonal blocks, subdiagonal blocks,
        and the masks of the entries stored there (diagonal: r >= c; subdiagonal: all within the
        band). Index npad (the last column) is a zero."""
        w, nb = self.w, self.nblocks
        width = self.npad + 1
        r, c = np.meshgrid(np.arange(w), np.arange(w), indexing="ij")
        blk = np.arange(nb)[:, None, None]
        off = np.abs(r - c)
        dmask = off < rows
        didx = np.where(dmask[None], np.minimum(off, rows - 1)[None] * width + blk * w + np.minimum(r, c)[None],
                        width - 1)
        # (i+1, i) block: offset w + r - c.
        loff = w + r - c
        lmask = loff < rows
        lidx = np.where(lmask[None], np.minimum(loff, rows - 1)[None] * width + blk[: max(nb - 1, 0)] * w + c[None],
                        width - 1)
        return didx, lidx, dmask, lmask


class BlockTridiagonal:
    """The map from X's band to Y = K^T X K in blocks, and back for the gradient."""

    def __init__(self, k_band: np.ndarray, bands: int, n: int) -> None:
        self.n, self.bands = n, bands
        self.p = k_band.shape[0] - 1
        self.blk = Blocking.make(n, bands, k_band.shape[0])
        w, nb = self.blk.w, self.blk.nblocks
        self._xd, self._xl, self._xdm, self._xlm = self.blk.index(bands)
        kd_idx, kl_idx, _, _ = self.blk.index(k_band.shape[0])
        kpad = np.zeros((k_band.shape[0], self.blk.npad + 1))
        kpad[:, :n] = k_band
        kpad[0, n: self.blk.npad] = 1.0  # identity padding
        r, c = np.meshgrid(np.arange(w), np.arange(w), indexing="ij")
        self.kd = np.where((r >= c)[None], kpad.ravel()[kd_idx], 0.0)  # K lower: diagonal blocks
        self.kl = np.where((r < c)[None], kpad.ravel()[kl_idx], 0.0) if nb > 1 else np.zeros((0, w, w))
        self.kdt, self.klt = np.swapaxes(self.kd, 1, 2), np.swapaxes(self.kl, 1, 2)
        self._lower = (r >= c)
        self._outside = np.arange(bands)[:, None] + np.arange(n)[None, :] >= n

    def x_blocks(self, band: np.ndarray, pad_value: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """X's diagonal and subdiagonal w x w blocks from lower band storage (padding: pad_value I)."""
        pad = np.zeros((self.bands, self.blk.npad + 1))
        pad[:, : self.n] = band
        pad[0, self.n: self.blk.npad] = pad_value
        flat = pad.ravel()
        return flat[self._xd], flat[self._xl]

    def y_blocks(self, xd: np.ndarray, xl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Y = K^T X K: its diagonal and subdiagonal blocks (Y is block-tridiagonal by the choice of
        w). K^T is block upper-bidiagonal (K_ii^T, K_(i+1,i)^T), X block-tridiagonal."""
        kd, kl, kdt, klt = self.kd, self.kl, self.kdt, self.klt
        xlt = np.swapaxes(xl, 1, 2)
        # U = X K: U_(j,i) for j = i - 1 .. i + 1 (the blocks used below).
        u_ii = xd @ kd
        u_ii[:-1] += xlt @ kl  # X_(i,i+1) K_(i+1,i)
        u_ni = xl @ kd[:-1]  # U_(i+1,i) = X_(i+1,i) K_ii + X_(i+1,i+1) K_(i+1,i)
        u_ni += xd[1:] @ kl
        yd = kdt @ u_ii
        yd[:-1] += klt @ u_ni  # K_(i+1,i)^T U_(i+1,i)
        # Y_(i+1,i) = K_(i+1,i+1)^T U_(i+1,i) + K_(i+2,i+1)^T U_(i+2,i), U_(i+2,i) = X_(i+2,i+1) K_(i+1,i)
        yl = kdt[1:] @ u_ni
        if len(xl) > 1:
            yl[:-1] += klt[1:] @ (xl[1:] @ kl[:-1])
        yd = 0.5 * (yd + np.swapaxes(yd, 1, 2))
        return yd, yl

    def y_direction(self, band: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """E = K^T D K for a band direction D (zero on the padding)."""
        return self.y_blocks(*self.x_blocks(band, 0.0))

    def pull_back(self, md: np.ndarray, ml: np.ndarray) -> np.ndarray:
        """The band (lower band storage, b rows) of K M K^T for the block-tridiagonal part of a
        symmetric M (its other blocks do not reach X's band since w >= b + p)."""
        kd, kl, kdt, klt = self.kd, self.kl, self.kdt, self.klt
        mlt = np.swapaxes(ml, 1, 2)
        # V = M K^T: V_(j,i) = sum_l M_(j,l) K^T_(l,i); K^T_(l,i) nonzero for l = i (K_ii^T), l = i - 1 (K_(i,i-1)^T).
        v_ii = md @ kdt
        v_ii[1:] += ml @ klt  # M_(i,i-1) K_(i,i-1)^T
        v_pi = mlt @ kdt[1:]  # V_(i,i+1) = M_(i,i+1) K_(i+1,i+1)^T + M_(i,i) K_(i+1,i)^T
        v_pi += md[:-1] @ klt
        # G_ii = K_ii V_(i,i) + K_(i,i-1) V_(i-1,i)
        gd = kd @ v_ii
        gd[1:] += kl @ v_pi
        # G_(i+1,i) = K_(i+1,i+1) V_(i+1,i) + K_(i+1,i) V_(i,i), V_(i+1,i) = M_(i+1,i) K_ii^T (its
        # M_(i+1,i-1) term lies more than w off the diagonal: it does not reach the band).
        gl = kd[1:] @ (ml @ kdt[:-1]) + kl @ v_ii[:-1]
        return self.unblock(gd, gl)

    def unblock(self, gd: np.ndarray, gl: np.ndarray) -> np.ndarray:
        """Lower band storage (b rows, n columns) of the band of a symmetric block-tridiagonal matrix."""
        out = np.zeros(self.bands * (self.blk.npad + 1))
        keep = self._xdm & self._lower
        out[self._xd[:, keep]] = gd[:, keep]
        if len(gl):
            out[self._xl[:, self._xlm]] = gl[:, self._xlm]
        band = out.reshape(self.bands, self.blk.npad + 1)[:, : self.n].copy()
        band[self._outside] = 0.0  # entries past the last row (padding)
        return band


@dataclass
class Factors:
    """The selected inversion of Y: S_i^-1, T_i, Z_i = (Y^-1)_ii and the sums P_i, Q_i."""

    sinv: np.ndarray
    t: np.ndarray
    z: np.ndarray
    zz: np.ndarray
    p: np.ndarray
    q: np.ndarray
    yl: np.ndarray
    trace: float


def selinv(yd: np.ndarray, yl: np.ndarray) -> Factors | None:
    """The selected inverse of the SPD block-tridiagonal Y (diagonal blocks ``yd`` (N, w, w),
    subdiagonal blocks ``yl`` (N - 1, w, w)); None if the block Cholesky breaks down."""
    from scipy.linalg.lapack import dpotrf, dpotri

    nb, w, _ = yd.shape
    eye = np.eye(w)
    sinv = np.empty_like(yd)
    t = np.empty_like(yl)
    s = yd[0]
    for i in range(nb):
        if i:
            s = yd[i] + t[i - 1] @ yl[i - 1].T  # Y_ii - Y_(i,i-1) S^-1 Y_(i,i-1)^T
        c, info = dpotrf(s, lower=1, clean=0)
        if info != 0:
            return None
        inv, info = dpotri(c, lower=1)
        if info != 0:
            return None
        inv = np.tril(inv)
        sinv[i] = inv + np.tril(inv, -1).T
        if i < nb - 1:
            t[i] = -yl[i] @ sinv[i]
    z = np.empty_like(yd)
    z[-1] = sinv[-1]
    for i in range(nb - 2, -1, -1):
        z[i] = sinv[i] + t[i].T @ z[i + 1] @ t[i]
    zz = z @ z
    p = np.zeros_like(yd)
    for i in range(1, nb):
        p[i] = t[i - 1] @ (eye + p[i - 1]) @ t[i - 1].T
    q = np.zeros_like(yd)
    for i in range(nb - 2, -1, -1):
        q[i] = t[i].T @ (zz[i + 1] + q[i + 1]) @ t[i]
    trace = float(np.einsum("kii->", z))
    if not np.isfinite(trace) or trace <= 0:
        return None
    return Factors(sinv, t, z, zz, p, q, yl, trace)


def square(fac: Factors) -> tuple[np.ndarray, np.ndarray]:
    """The diagonal and subdiagonal blocks of Y^-2."""
    z, p, q, t = fac.z, fac.p, fac.q, fac.t
    d2 = z @ p @ z + fac.zz + q
    l2 = z[1:] @ t @ (p[:-1] @ z[:-1] + z[:-1]) + (fac.zz[1:] + q[1:]) @ t
    return d2, l2


def tangent(fac: Factors, ed: np.ndarray, el: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The directional derivative of (the blocks of) Y^-2 in the direction E (blocks ``ed``,
    ``el``): forward-mode differentiation of :func:`selinv` and :func:`square`."""
    sinv, t, z, zz, p, q, yl = fac.sinv, fac.t, fac.z, fac.zz, fac.p, fac.q, fac.yl
    nb, w, _ = z.shape
    dsinv = np.empty_like(z)
    dt = np.empty_like(t)
    ds = ed[0]
    for i in range(nb):
        if i:
            # dS_i = E_ii + E_(i,i-1) T^T + T E_(i,i-1)^T - Y_(i,i-1) dS^-1 Y_(i,i-1)^T
            a = el[i - 1] @ t[i - 1].T
            ds = ed[i] + a + a.T - yl[i - 1] @ dsinv[i - 1] @ yl[i - 1].T
        dsinv[i] = -sinv[i] @ ds @ sinv[i]
        if i < nb - 1:
            dt[i] = -el[i] @ sinv[i] - yl[i] @ dsinv[i]
    dz = np.empty_like(z)
    dz[-1] = dsinv[-1]
    for i in range(nb - 2, -1, -1):
        a = dt[i].T @ z[i + 1] @ t[i]
        dz[i] = dsinv[i] + a + a.T + t[i].T @ dz[i + 1] @ t[i]
    dzz = dz @ z
    dzz += np.swapaxes(dzz, 1, 2)
    eye = np.eye(w)
    dp = np.zeros_like(z)
    for i in range(1, nb):
        a = dt[i - 1] @ (eye + p[i - 1]) @ t[i - 1].T
        dp[i] = a + a.T + t[i - 1] @ dp[i - 1] @ t[i - 1].T
    dq = np.zeros_like(z)
    for i in range(nb - 2, -1, -1):
        a = dt[i].T @ (zz[i + 1] + q[i + 1]) @ t[i]
        dq[i] = a + a.T + t[i].T @ (dzz[i + 1] + dq[i + 1]) @ t[i]
    zpz = dz @ p @ z
    dd2 = zpz + np.swapaxes(zpz, 1, 2) + z @ dp @ z + dzz + dq
    # (Y^-2)_(i+1,i) = Z_(i+1) T_i (I + P_i) Z_i + (Z_(i+1)^2 + Q_(i+1)) T_i
    ipz = p[:-1] @ z[:-1] + z[:-1]  # (I + P_i) Z_i
    dipz = dp[:-1] @ z[:-1] + p[:-1] @ dz[:-1] + dz[:-1]
    dl2 = (dz[1:] @ t @ ipz + z[1:] @ dt @ ipz + z[1:] @ t @ dipz
           + (dzz[1:] + dq[1:]) @ t + (zz[1:] + q[1:]) @ dt)
    return dd2, dl2


class FastBandObjective:
    """f(X) = tr(A X^-1 A^T), its gradient on the band and its Hessian in a band direction, for
    a workload with banded inverse K (band storage from :func:`banded_inverse`), in O(n w^2)."""

    def __init__(self, k_band: np.ndarray, bands: int, n: int) -> None:
        self.map = BlockTridiagonal(k_band, bands, n)
        self.padding = self.map.blk.npad - n

    def value(self, band: np.ndarray) -> tuple[float, Factors | None]:
        """f(X) and the factors for :meth:`gradient` / :meth:`hessian`; (inf, None) if X is not
        numerically positive definite."""
        yd, yl = self.map.y_blocks(*self.map.x_blocks(band))
        fac = selinv(yd, yl)
        if fac is None:
            return float("inf"), None
        f = fac.trace - self.padding
        if not np.isfinite(f) or f <= 0:
            return float("inf"), None
        return f, fac

    def gradient(self, fac: Factors) -> np.ndarray:
        """The band of the gradient -X^-1 A^T A X^-1 = -K Y^-2 K^T (lower band storage)."""
        d2, l2 = square(fac)
        return -self.map.pull_back(d2, l2)

    def hessian(self, fac: Factors, d: np.ndarray) -> np.ndarray:
        """The band of the Hessian of f in the band direction D: K (Z E Z^2 + Z^2 E Z) K^T with
        E = K^T D K (Z = Y^-1)."""
        ed, el = self.map.y_direction(d)
        dd2, dl2 = tangent(fac, ed, el)
        return -self.map.pull_back(dd2, dl2)
