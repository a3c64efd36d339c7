"""Fixed-epoch optimum by Newton's method on the block-structured dual (docs/multi-participation.md).

The problem (:mod:`mfcli.optimize.multi_solver`): minimise tr(M X^-1), M = A^T A, over X > 0 with X_ij = 0
for i != j in one residue class (class c = i mod b, k epochs of b steps) and, per class,
sum_{i in c} X_ii <= 1. In class-major order the dual variable W is block-diagonal: b blocks W_c
of size k x k with a constant diagonal lambda_c (the multiplier of the class sum; the off-diagonal
entries are the multipliers of the orthogonality constraints). With W = R R^T (R the per-class
Cholesky factor) and H = R^T M R = Q diag(s^2) Q^T,

* the concave dual is g(W) = 2 tr(H^1/2) - sum_c lambda_c; its best rescaling gives the bound
  (sum s)^2 / sum_c lambda_c (:func:`mfcli.optimize.multi_solver.dual_bound` with the nuclear norm of A R);
* the Lagrangian minimiser is X(W) = V diag(s) V^T with V = R^-T Q; the gradient of g in a
  direction E (block-diagonal, constant diagonal per block) is <X(W), E> - sum_c tr(E_c) / k, the
  infeasibility of X(W);
* minus the Hessian (Daleckii-Krein, as in :mod:`mfcli.optimize.dense`) is the quadratic form
  E -> sum_ij w_ij (v_i^T E v_j)^2 with w_ij = 1 / (1/s_i + 1/s_j). With the exponential sum
  w_ij ~ sum_r c_r exp(-tau_r / s_i) exp(-tau_r / s_j) of :func:`mfcli.optimize.dense.kernel_sum` it is
  E -> sum_r <E, P_r E P_r>, P_r = V diag(c_r^1/2 exp(-tau_r / s)) V^T: one float32 SYRK per term,
  then every Hessian-vector product costs O(n^2 k) (only the class blocks of P_r E P_r are needed,
  and E is block-diagonal). The kernel is positive and its relative error e a few per cent, so the
  approximate Hessian is within (1 +- e) of the true one: the step is Newton's up to 1 +- e.

The Newton system is solved by conjugate gradients preconditioned with the approximate Hessian
less the couplings between off-diagonal multipliers of different classes: the per-class blocks
(k(k-1)/2 + 1 unknowns each) plus the full b x b coupling of the class multipliers lambda_c,
factored by a Schur complement on the lambda_c. Each class takes its own step length
(:func:`_step_lengths`: multiplicative where the step shrinks W_c, so W_c stays positive
definite), the dual is rescaled to its best multiple after each eigendecomposition (free), and a
step whose dual bound falls is halved.

Coarse-to-fine start: adjacent steps within each epoch are merged (b -> ceil(b / 2), same k,
Gram matrix summed over the pairs) down to 128..255 steps; each level is solved to a Newton
decrement of 1e-4 and its blocks W_c are interpolated linearly across classes (a convex
combination: positive definite, constant diagonal) to the next level. Coarse levels certify nothing.

Feasible primal from a dual iterate: T_c = X_cc^-1/2 diag(X_cc)^1/2 (Loewdin) makes each class
block of T^T X T diagonal with the diagonal of X_cc; scaling each class to trace 1 makes it
feasible. Its loss tr(M X~^-1) = sum_i ||A Z q_i||^2 / s_i (Z = T^-1 R) is a sum of positive
terms. Near the optimum X(W) is nearly feasible and the loss gap is second order in the dual error.

The certificate is the dual bound with sum s replaced by a proven lower bound on ||A R||_*
(:func:`nuclear_lower_bound`, from the eigenvectors Q: one TRMM and one SYRK), or by the singular
values of A R (:func:`mfcli.optimize.multi_solver.dual_bound`) when that route does not apply. The caller
(:func:`mfcli.optimize.multi_solver.multi_participation_factorization`) recomputes the loss from the
returned B and C and compares it with this bound.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mfcli.optimize.dense import Progress, kernel_sum
from mfcli.optimize.pcg import pcg

#: Largest epoch count k handled here (the per-class preconditioner blocks have k(k-1)/2 + 1 rows;
#: b of them are kept). Larger k goes to the primal solver of :mod:`mfcli.optimize.multi_solver`.
MAX_EPOCHS = 32
#: Coarse levels are used for n >= 2 * COARSE_MIN_N; the coarsest has fewer than 2 * COARSE_MIN_N steps.
COARSE_MIN_N = 128
COARSE_TOL = 1e-4
COARSE_MAX_ITER = 40
#: Conjugate-gradient iterations at most per Newton step, and the relative residual aimed at
#: (the approximate Hessian is itself a few per cent off, so more accuracy is wasted).
CG_MAX = 60
CG_TOL = 1e-2
MAX_HALVINGS = 10
LOG_STEP_LIMIT = 4.0
STALL_LIMIT = 4
#: ``Progress.method`` of the full-size iterations (and the solver record's ``method``).
DUAL_METHOD = "dual-newton-fixed-epoch"


@dataclass
class FixedEpochDual:
    """What :func:`solve_dual` returns: a feasible X (natural order), its estimated loss, the best
    certified dual bound (-inf if none was computed), full-size iterations, coarse levels and the
    progress history."""

    x: np.ndarray
    primal: float
    dual: float
    iterations: int
    coarse: list[tuple[int, int]]
    history: list[Progress]


def applicable(n: int, k: int) -> bool:
    """Whether the dual method handles k epochs of n / k steps."""
    return 1 <= k <= MAX_EPOCHS and n % k == 0


# ---------------------------------------------------------------- block-diagonal helpers
# Class-major order: position c * k + e holds the natural step e * b + c (epoch e, class c).


def _cm_order(k: int, b: int) -> np.ndarray:
    """Natural index of each class-major position."""
    return (np.arange(k)[None, :] * b + np.arange(b)[:, None]).reshape(-1)


def _right(mat: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """mat @ blockdiag(blocks) (class-major columns)."""
    b, k, _ = blocks.shape
    m = mat.shape[0]
    out = np.matmul(mat.reshape(m, b, k).transpose(1, 0, 2), blocks)  # (b, m, k)
    return out.transpose(1, 0, 2).reshape(m, b * k)


def _left_t(blocks: np.ndarray, mat: np.ndarray) -> np.ndarray:
    """blockdiag(blocks)^T @ mat (class-major rows)."""
    b, k, _ = blocks.shape
    return np.matmul(blocks.transpose(0, 2, 1), mat.reshape(b, k, -1)).reshape(b * k, -1)


def _diag_blocks(mat: np.ndarray, b: int, k: int) -> np.ndarray:
    """The b diagonal k x k blocks of a class-major matrix."""
    m4 = mat.reshape(b, k, b, k)
    idx = np.arange(b)
    return m4[idx, :, idx, :]


def _project(e: np.ndarray) -> np.ndarray:
    """Orthogonal projection onto symmetric blocks with a constant diagonal (the dual directions)."""
    e = 0.5 * (e + e.transpose(0, 2, 1))
    d = np.einsum("cii->ci", e)
    mean = d.mean(axis=1)
    k = e.shape[1]
    e[:, np.arange(k), np.arange(k)] = mean[:, None]
    return e


# ---------------------------------------------------------------- one evaluation


@dataclass
class _Eval:
    w: np.ndarray  # (b, k, k) dual blocks (rescaled)
    lower: np.ndarray  # (b, k, k) Cholesky factors of w
    s: np.ndarray  # sqrt eigenvalues of R^T M R (ascending)
    q: np.ndarray  # eigenvectors
    v: np.ndarray  # R^-T Q (class-major rows)
    grad: np.ndarray  # (b, k, k) gradient of g in the direction space
    dual: float  # (sum s)^2 / sum lambda (eigh estimate)
    value: float  # g(W) = 2 sum s - sum lambda at the rescaled W (= dual)


def _evaluate(gram_cm: np.ndarray, w: np.ndarray) -> _Eval | None:
    """Eigendecompose at W, rescale W to its best multiple, and return gradient and bounds."""
    import scipy.linalg

    b, k, _ = w.shape
    try:
        lower = np.linalg.cholesky(w)
    except np.linalg.LinAlgError:
        return None
    h = _left_t(lower, _right(gram_cm, lower))
    h = np.asfortranarray(0.5 * (h + h.T))
    lam, q = scipy.linalg.eigh(h, overwrite_a=True, check_finite=False, driver="evd")
    del h
    lam = np.maximum(lam, lam[-1] * 1e-300 if lam[-1] > 0 else 1e-300)
    s = np.sqrt(lam)
    mass = float(np.sum(w[:, 0, 0]))
    c = (float(s.sum()) / mass) ** 2
    rc = math.sqrt(c)
    w = w * c
    lower = lower * rc
    s = s * rc
    # V = R^-T Q: per class L_c^-T times the class rows of Q.
    inv_t = np.linalg.inv(lower).transpose(0, 2, 1)
    v = np.matmul(inv_t, q.reshape(b, k, -1)).reshape(b * k, -1)
    vb = v.reshape(b, k, -1)
    xcc = np.matmul(vb * s[None, None, :], vb.transpose(0, 2, 1))
    grad = _project(xcc) - np.eye(k)[None, :, :] / k
    dual = float(s.sum()) ** 2 / (mass * c)
    return _Eval(w=w, lower=lower, s=s, q=q, v=v, grad=grad, dual=dual, value=2 * float(s.sum()) - mass * c)


# ---------------------------------------------------------------- Newton direction


class _Hessian:
    """The approximate Hessian (minus the dual's) at one evaluation, its products and the
    per-class block preconditioner."""

    def __init__(self, ev: _Eval, terms: int | None) -> None:
        import scipy.linalg

        s, v = ev.s, ev.v
        b, k, _ = ev.w.shape
        self.b, self.k = b, k
        coef, rates, x_min, s_safe = kernel_sum(s, terms, _terms)
        v32 = v.astype(np.float32)
        self.ps: list[np.ndarray] = []  # P_r, class-major rows as (b, k, n)
        blocks = []
        lamlam = np.zeros((b, b))  # the Hessian on the multipliers mu_c (basis I_c / sqrt k)
        for cr, tr in zip(coef, rates, strict=True):
            if cr <= 0.0:
                continue
            e = np.exp(-(tr / x_min) / s_safe)
            cols = np.nonzero(e > 6e-6)[0]
            if cols.size == 0:
                continue
            y = v32[:, cols] * np.sqrt(e[cols] * math.sqrt(cr / x_min)).astype(np.float32)
            p = scipy.linalg.blas.ssyrk(1.0, y, trans=0, lower=0)  # upper triangle; the lower is zero
            del y
            diag = np.diag(p).copy()
            p += p.T  # the products read whole rows: mirror (cheaper than a GEMM)
            p[np.diag_indices_from(p)] = diag
            self.ps.append(p.reshape(b, k, b * k))
            blocks.append(_diag_blocks(p, b, k))
            lamlam += np.square(p).reshape(b, k, b, k).sum(axis=(1, 3), dtype=np.float64) / k
        self._precondition(np.array(blocks, dtype=np.float64), lamlam)

    def apply(self, e: np.ndarray) -> np.ndarray:
        """Class blocks of sum_r P_r E P_r, projected onto the direction space."""
        b, k = self.b, self.k
        e32 = e.astype(np.float32)
        out = np.zeros((b, k, k), dtype=np.float64)
        for p in self.ps:
            ep = np.matmul(e32, p)  # (E P) in class-major rows: (b, k, n)
            # (P E P)_cc = P[c rows, :] @ (E P)[:, c cols]
            epc = ep.reshape(b * k, b, k).transpose(1, 0, 2)  # (b, n, k): columns of class c
            out += np.matmul(p, epc)
        return _project(out)

    def _precondition(self, blocks: np.ndarray, lamlam: np.ndarray) -> None:
        """The approximate Hessian without the couplings between the off-diagonal multipliers of
        different classes, factored: per class the k(k-1)/2 + 1 square block in the orthonormal
        basis {I / sqrt k, (e_a e_b^T + e_b e_a^T) / sqrt 2}, plus the full b x b coupling of the
        class multipliers mu_c (the single-participation-like part, strongly coupled across
        neighbouring classes). Off-diagonal multipliers are eliminated per class (Schur complement
        on the mu_c, one b x b Cholesky); if that fails, the per-class blocks alone."""
        import scipy.linalg

        k = self.k
        ia, ib = np.triu_indices(k, 1)
        self.ia, self.ib = ia, ib
        q = 1 + ia.size
        h = np.zeros((self.b, q, q))
        # blocks: (terms, b, k, k); each term adds <B_x, P E P> for basis elements B_x, B_y.
        h[:, 0, 0] = np.einsum("rcij,rcij->c", blocks, blocks) / k
        if ia.size:
            col = math.sqrt(2.0 / k) * np.matmul(blocks, blocks)[:, :, ia, ib].sum(axis=0)
            h[:, 0, 1:] = col
            h[:, 1:, 0] = col
            for bl in blocks:  # one term at a time: each gather is b (k(k-1)/2)^2 numbers
                h[:, 1:, 1:] += bl[:, ia[:, None], ia[None, :]] * bl[:, ib[:, None], ib[None, :]]
                h[:, 1:, 1:] += bl[:, ia[:, None], ib[None, :]] * bl[:, ib[:, None], ia[None, :]]
        d = np.sqrt(np.maximum(np.einsum("cii->ci", h), 1e-300))
        h /= d[:, :, None] * d[:, None, :]
        h += 1e-10 * np.eye(q)[None]
        self.d = d
        self.pinv = np.linalg.inv(h)
        self.schur = None
        zinv = np.linalg.inv(h[:, 1:, 1:]) if q > 1 else np.zeros((self.b, 0, 0))
        u = h[:, 1:, 0]
        zu = np.einsum("cij,cj->ci", zinv, u)
        s = lamlam / (d[:, :1] * d[:, 0][None, :])
        s[np.diag_indices_from(s)] -= np.einsum("ci,ci->c", u, zu)
        s[np.diag_indices_from(s)] += 1e-10
        try:
            self.schur = (scipy.linalg.cho_factor(s, check_finite=False), zinv, u, zu)
        except (np.linalg.LinAlgError, ValueError):
            self.schur = None

    def precondition(self, r: np.ndarray) -> np.ndarray:
        k = self.k
        coords = np.empty((self.b, 1 + self.ia.size))
        coords[:, 0] = np.einsum("cii->c", r) / math.sqrt(k)
        coords[:, 1:] = math.sqrt(2.0) * r[:, self.ia, self.ib]
        coords /= self.d
        if self.schur is not None:
            import scipy.linalg

            factor, zinv, u, zu = self.schur
            yz = np.einsum("cij,cj->ci", zinv, coords[:, 1:])
            lam = scipy.linalg.cho_solve(factor, coords[:, 0] - np.einsum("ci,ci->c", u, yz), check_finite=False)
            z = np.concatenate([lam[:, None], yz - zu * lam[:, None]], axis=1)
        else:
            z = np.einsum("cij,cj->ci", self.pinv, coords)
        z /= self.d
        out = np.zeros_like(r)
        out[:, np.arange(k), np.arange(k)] = (z[:, 0] / math.sqrt(k))[:, None]
        off = z[:, 1:] / math.sqrt(2.0)
        out[:, self.ia, self.ib] = off
        out[:, self.ib, self.ia] = off
        return out


def _terms(log_range: float) -> int:
    """Exponential-sum length: ~5 % relative kernel error (4 terms for a range of e^4, 8 for
    e^12, 10 for e^16). Fewer than the single-participation solver's ~2 %: every term costs a
    SYRK and a product in each CG step, and measured at n = 1024 (momentum, 16 epochs) the
    iteration counts were the same with 8 terms as with 10, and 25 % less CPU time."""
    return int(min(16, max(4, round(0.5 * log_range + 2.0))))


def _newton_direction(ev: _Eval, terms: int | None) -> tuple[np.ndarray, float, int]:
    """Preconditioned CG (:func:`mfcli.optimize.pcg.pcg`) on H d = grad; returns d, the relative Newton
    decrement and the CG steps (Hessian products)."""
    hess = _Hessian(ev, terms)
    g = ev.grad
    res = pcg(hess.apply, hess.precondition, g, rtol=CG_TOL, max_steps=CG_MAX)
    d = res.solution
    decrement = float(np.vdot(g, d)) / (2.0 * abs(ev.value)) if ev.value else math.inf
    return d, decrement, res.steps


def _step_lengths(lower: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Per-class step lengths t_c that keep W_c + t_c D_c positive definite (W_c = L L^T).

    With mu the smallest eigenvalue of L^-1 D_c L^-T, the full step shrinks W_c along its worst
    direction by the factor 1 + mu; where mu < 0, t_c = (1 - e^mu) / (-mu) shrinks it by e^mu
    instead (the multiplicative step of the single-participation solver, which moves a weight
    v -> v e^dx where dx < 0): positive definite, and the Newton step to first order when mu is small."""
    li = np.linalg.inv(lower)
    mus = np.linalg.eigvalsh(np.matmul(np.matmul(li, d), li.transpose(0, 2, 1)))
    mu, top = mus[:, 0], mus[:, -1]
    neg = np.minimum(mu, -1e-300)
    t = np.where(mu < 0, -np.expm1(neg) / -neg, 1.0)
    # As the single-participation solver does, no eigenvalue moves by more than e^LOG_STEP_LIMIT:
    # shorten all classes uniformly.
    big = float(np.max(np.maximum(-mu, np.log1p(np.maximum(t * top, 0.0)))))
    return t * (LOG_STEP_LIMIT / big) if big > LOG_STEP_LIMIT else t


class _Walker:
    """Safeguarded Newton iterates: a trial whose dual bound falls below the last accepted one is
    replaced by half the step."""

    def __init__(self, terms: int | None) -> None:
        self.terms = terms
        self.accepted: _Eval | None = None
        self.step: np.ndarray | None = None
        self.t = np.ones(0)
        self.halvings = 0
        self.decrement = math.inf
        self.cg_steps = 0

    def retreat(self) -> np.ndarray | None:
        """Half the last step from the accepted point (None when there is none or after
        ``MAX_HALVINGS``)."""
        if self.accepted is None or self.step is None or self.halvings >= MAX_HALVINGS:
            return None
        self.halvings += 1
        self.t = self.t * 0.5
        return self.accepted.w + self.t[:, None, None] * self.step

    def next(self, ev: _Eval) -> np.ndarray | None:
        acc = self.accepted
        if acc is not None and self.step is not None and ev.dual < acc.dual * (1 - 1e-13):
            return self.retreat()
        self.accepted = ev
        self.halvings = 0
        d, self.decrement, steps = _newton_direction(ev, self.terms)
        self.cg_steps += steps
        self.step = d
        self.t = _step_lengths(ev.lower, d)
        return ev.w + self.t[:, None, None] * d


# ---------------------------------------------------------------- primal and certificate


def _feasible(ev: _Eval) -> tuple[np.ndarray, np.ndarray]:
    """Per-class T (Loewdin, then trace 1) and T^-1 for the feasible X~ = T^T X(W) T."""
    b, k, _ = ev.w.shape
    vb = ev.v.reshape(b, k, -1)
    xcc = np.matmul(vb * ev.s[None, None, :], vb.transpose(0, 2, 1))
    xcc = 0.5 * (xcc + xcc.transpose(0, 2, 1))
    mu, u = np.linalg.eigh(xcc)
    mu = np.maximum(mu, mu[:, -1:] * 1e-300)
    dg = np.sqrt(np.einsum("cii->ci", xcc))
    scale = 1.0 / np.sqrt(np.einsum("cii->c", xcc))
    # T = X_cc^-1/2 diag(X_cc)^1/2 / sqrt(tr X_cc); T^-1 = diag(X_cc)^-1/2 X_cc^1/2 sqrt(tr X_cc).
    t = np.matmul(u * mu[:, None, :] ** -0.5, u.transpose(0, 2, 1)) * (dg * scale[:, None])[:, None, :]
    t_inv = (np.matmul(u * mu[:, None, :] ** 0.5, u.transpose(0, 2, 1)) / dg[:, None, :].transpose(0, 2, 1)
             / scale[:, None, None])
    return t, t_inv


def _primal(a: np.ndarray, order: np.ndarray, ev: _Eval) -> tuple[float, tuple[np.ndarray, np.ndarray]]:
    """Loss tr(M X~^-1) of the feasible X~ = T^T X(W) T: X~^-1 = Z diag(1/s) Z^T with Z = T^-1 R Q,
    so the loss is sum_i ||A z_i||^2 / s_i (positive terms)."""
    import scipy.linalg

    t, t_inv = _feasible(ev)
    b, k, _ = t.shape
    z = np.matmul(np.matmul(t_inv, ev.lower), ev.q.reshape(b, k, -1)).reshape(b * k, -1)
    nat = np.empty_like(z)
    nat[order] = z
    az = scipy.linalg.blas.dtrmm(1.0, a, nat, lower=1)
    val = float(np.sum(np.einsum("ij,ij->j", az, az) / ev.s))
    return val, (t, ev.v * np.sqrt(ev.s)[None, :])


def _gram_from(parts: tuple[np.ndarray, np.ndarray], order: np.ndarray) -> np.ndarray:
    """X~ = T^T V diag(s) V^T T in natural order."""
    import scipy.linalg

    t, vs = parts
    y = _left_t(t, vs)
    x = scipy.linalg.blas.dsyrk(1.0, y)
    x = np.triu(x) + np.triu(x, 1).T
    out = np.empty_like(x)
    out[np.ix_(order, order)] = x
    return out


def nuclear_lower_bound(y: np.ndarray) -> float | None:
    """A lower bound on ||Y||_* from the columns of Y (K U for an orthogonal U): with column norms
    d_i and normalised Gram I + F, ||Y||_* >= sum_i d_i (1 - sum_j F_ij^2 / 2) when ||F||_F <= 1
    (:func:`mfcli.optimize.dense.certified_dual`, route 1). None when that route does not apply."""
    import scipy.linalg

    d = np.sqrt(np.einsum("ij,ij->j", y, y))
    if not (np.all(np.isfinite(d)) and np.all(d > 0)):
        return None
    yn = y / d[None, :]
    f = scipy.linalg.blas.dsyrk(1.0, yn, trans=1, lower=0)
    del yn
    np.fill_diagonal(f, 0.0)
    f *= f
    row = f.sum(axis=0) + f.sum(axis=1)
    if not (np.all(np.isfinite(row)) and float(row.sum()) <= 1.0):
        return None
    return float(np.sum(d * (1.0 - 0.5 * row)))


def _certified(a: np.ndarray, order: np.ndarray, ev: _Eval) -> float:
    """Certified dual bound at W: ||A R||_*^2 / sum lambda, the nuclear norm bounded from below
    through the eigenvectors Q (A R Q), else from the singular values of A R."""
    import scipy.linalg

    b, k, _ = ev.w.shape
    # The largest diagonal entry of each block: W plus a non-negative diagonal is still a dual
    # point with that mass and a nuclear norm at least ||A R||_* (round-off cannot help the bound).
    mass = float(np.sum(np.einsum("cii->ci", ev.w).max(axis=1)))
    rq = np.matmul(ev.lower, ev.q.reshape(b, k, -1)).reshape(b * k, -1)
    nat = np.empty_like(rq)
    nat[order] = rq
    y = scipy.linalg.blas.dtrmm(1.0, a, nat, lower=1)
    nuc = nuclear_lower_bound(y)
    if nuc is None:
        r = np.zeros((b * k, b * k))
        for c in range(b):
            r[c * k:(c + 1) * k, c * k:(c + 1) * k] = ev.lower[c]
        rn = np.empty_like(r)
        rn[order] = r
        sigma = scipy.linalg.svdvals(a @ rn, overwrite_a=True, check_finite=False)
        nuc = float(sigma.sum())
    return nuc * nuc / mass


# ---------------------------------------------------------------- levels


def _coarsen(gram: np.ndarray, k: int, b: int) -> tuple[np.ndarray, int]:
    """Gram matrix (natural order) with adjacent steps of each epoch merged: b -> ceil(b / 2)."""
    g4 = gram.reshape(k, b, k, b)
    if b % 2:
        g4 = np.pad(g4, ((0, 0), (0, 1), (0, 0), (0, 1)))
    g4 = g4[:, 0::2] + g4[:, 1::2]
    g4 = g4[:, :, :, 0::2] + g4[:, :, :, 1::2]
    bc = g4.shape[1]
    return np.ascontiguousarray(g4.reshape(k * bc, k * bc)), bc


def _interpolate(w: np.ndarray, b: int) -> np.ndarray:
    """Blocks for b classes from blocks for fewer, linear in the class position (convex weights)."""
    bc = w.shape[0]
    if bc == b:
        return w.copy()
    src = (np.arange(bc) + 0.5) / bc
    dst = (np.arange(b) + 0.5) / b
    j = np.clip(np.searchsorted(src, dst) - 1, 0, max(bc - 2, 0))
    if bc == 1:
        return np.repeat(w, b, axis=0)
    t = np.clip((dst - src[j]) / (src[j + 1] - src[j]), 0.0, 1.0)
    return (1 - t)[:, None, None] * w[j] + t[:, None, None] * w[j + 1]


def _to_cm(gram: np.ndarray, k: int, b: int) -> np.ndarray:
    order = _cm_order(k, b)
    return np.ascontiguousarray(gram[np.ix_(order, order)])


def _coarse_start(gram: np.ndarray, k: int, b: int, terms: int | None, *,
                  callback: Callable[[Progress], None] | None = None,
                  start: float | None = None) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Starting blocks from the coarse-to-fine sequence (identity blocks when n is small).

    ``callback`` gets a :class:`~mfcli.optimize.dense.Progress` after every step on a coarse level, with
    ``stage`` naming the level and its Newton decrement, and NaN primal, dual and gap: a coarse
    level solves a smaller problem, so it has no bound or gap for the real one (its decrement
    says how far that coarse problem is from its own optimum). ``start``: the solve's
    ``time.perf_counter()`` origin for ``seconds``."""
    levels = [(gram, b)]
    while k * levels[-1][1] >= 2 * COARSE_MIN_N and levels[-1][1] >= 2:
        levels.append(_coarsen(*levels[-1][:1], k, levels[-1][1]))
    levels.pop(0)
    w = np.broadcast_to(np.eye(k), (levels[-1][1] if levels else b, k, k)).copy()
    done: list[tuple[int, int]] = []
    t0 = time.perf_counter() if start is None else start
    for level, (g, bc) in enumerate(reversed(levels), start=1):
        w = _interpolate(w, bc)
        gcm = _to_cm(g, k, bc)
        walker = _Walker(terms)
        evals = 0
        for evals in range(1, COARSE_MAX_ITER + 1):
            ev = _evaluate(gcm, w)
            nxt = walker.retreat() if ev is None else walker.next(ev)  # None: W not numerically PD
            if callback is not None:
                dec = (f"Newton decrement {walker.decrement:.1e} on the coarse problem"
                       if math.isfinite(walker.decrement) else "not yet evaluated")
                callback(Progress(evals, math.nan, math.nan, math.nan, time.perf_counter() - t0, DUAL_METHOD,
                                  stage=f"coarse level {level} of {len(levels)} ({k * bc} of {k * b} steps): {dec}, "
                                        f"no bound on n = {k * b} yet"))
            if nxt is None or (walker.halvings == 0 and walker.decrement <= COARSE_TOL):
                break
            w = nxt
        if walker.accepted is not None:
            w = walker.accepted.w
        done.append((k * bc, evals))
    return _interpolate(w, b), done


def solve_dual(
    a: np.ndarray, k: int, *, tol: float, max_iter: int, callback: Callable[[Progress], None] | None = None,
    terms: int | None = None, multilevel: bool = True,
) -> FixedEpochDual | None:
    """Newton on the fixed-epoch dual for workload ``a`` (n x n lower-triangular) and k epochs.

    Stops when the certified gap against the estimated primal is at most ``tol``, after
    ``max_iter`` full-size eigendecompositions, or when the iteration stalls (round-off). None if
    not even the starting W could be evaluated (the caller then runs the primal solver).
    ``callback`` gets every full-size iteration's :class:`~mfcli.optimize.dense.Progress` and, before
    them, one per coarse-level step (``stage`` set, no primal, dual or gap: :func:`_coarse_start`)."""
    import scipy.linalg

    start = time.perf_counter()
    n = a.shape[0]
    b = n // k
    order = _cm_order(k, b)
    gram = scipy.linalg.blas.dsyrk(1.0, a, trans=1, lower=0)
    gram = np.triu(gram) + np.triu(gram, 1).T
    if multilevel:
        w, coarse = _coarse_start(gram, k, b, terms, callback=callback, start=start)
    else:
        w, coarse = np.broadcast_to(np.eye(k), (b, k, k)).copy(), []
    gram_cm = _to_cm(gram, k, b)
    del gram
    walker = _Walker(terms)
    best_primal, best_parts = math.inf, None
    best_dual_est, cert = -math.inf, -math.inf
    best_ev: _Eval | None = None
    history: list[Progress] = []
    stalled = 0
    it = 0
    for it in range(1, max_iter + 1):
        ev = _evaluate(gram_cm, w)
        if ev is None:  # a trial W that is not numerically positive definite: shorter step
            nxt = walker.retreat()
            if nxt is None:
                break
            w = nxt
            continue
        improved = False
        f, parts = _primal(a, order, ev)
        if f < best_primal:
            improved = f < best_primal * (1 - 1e-15)
            best_primal, best_parts = f, parts
        if ev.dual > best_dual_est:
            improved = improved or ev.dual > best_dual_est * (1 + 1e-15)
            best_dual_est, best_ev = ev.dual, ev
        stalled = 0 if improved else stalled + 1
        gap = (best_primal - max(best_dual_est, cert)) / best_primal
        if gap <= tol:
            cert = max(cert, _certified(a, order, ev))
            if best_ev is not None and best_ev is not ev and (best_primal - cert) / best_primal > tol:
                cert = max(cert, _certified(a, order, best_ev))
            gap = (best_primal - cert) / best_primal
        prog = Progress(it, best_primal, cert if cert > -math.inf else best_dual_est, gap,
                        time.perf_counter() - start, DUAL_METHOD)
        history.append(prog)
        if callback is not None:
            callback(prog)
        if cert > -math.inf and gap <= tol:
            break
        if stalled >= STALL_LIMIT:
            break
        nxt = walker.next(ev)
        del ev
        if nxt is None:
            break
        w = nxt
    if cert == -math.inf and best_ev is not None:
        cert = _certified(a, order, best_ev)
    if best_parts is None:
        return None
    x = _gram_from(best_parts, order)
    return FixedEpochDual(x=x, primal=best_primal, dual=cert, iterations=it, coarse=coarse, history=history)
