"""Optimal multi-draft acceptance alpha* and closed-form verifier acceptances.

Hu et al., "Towards Optimal Multi-Draft Speculative Decoding" (ICLR 2025). For a draft law
p_draft on n-tuples built from q, the best acceptance any lossless verifier can reach is

    alpha* = 1 + min_H [P(H) - Q(H)],   Q(H) = Prob[all drafts lie in H]     (Hu et al. Eq. 8)

and the minimiser H* is a certificate: 1 - alpha* = Q(H*) - P(H*) is rejection mass no
verifier can avoid. Hu et al. Thm. 6 / §4.2.1: some optimal H is a prefix of the tokens sorted
by q/p decreasing (p = target, q = draft). Q per draft scheme (Hu et al. §2.3, §4.2.2):

- "with_replacement": Q(H) = q(H)^n.
- "without_replacement": sequential draws from q renormalised over the tokens not yet drawn.
  The paper's generating-function Q is NOT this law (docs/derivations.md, Optimal
  multi-draft); we use the exact Q: closed form for n = 2, exact enumeration for tiny
  supports, and otherwise the exponential-clock integral (same section) on a trapezoid grid
  in log t (error < 1e-8). The prefix scan is proven for q-convex Q only; for this Q it is
  empirical, and the tests check it against the brute-force LP (tests/oracles.py).
- "greedy": Top_{n-1}(q) plus one draw from q^{¬T} (Hu et al. §5.1, Thm. 7).

Inputs are (V,) distributions (float32 or float64); all arithmetic is float64 and both
inputs are renormalised.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from engine.verify.token import greedy_top, kseq_beta, kseq_rho, without

SCHEMES = ("with_replacement", "without_replacement", "greedy")
ENUM_LIMIT = 1_000  # ordered draws up to which "without_replacement" Q is enumerated exactly
CERT_TOL = 1e-12  # f within this of its minimum counts as minimal (the shortest H* wins)
CLOCK_STEP = 0.35  # trapezoid step in u = log t; error ~exp(-2*pi*d/h), measured < 1e-9
CLOCK_BLOCK = 1 << 17  # elements of a (grid, token block) temporary, ~1 MB: stays in cache
EXP_FLOOR = 690.0  # e^{-690} ~ 1e-300: smaller terms become 0, never slow subnormals
F64 = torch.float64


@dataclass(frozen=True)
class OptimalResult:
    """alpha* of one draft scheme with its certificate H* (Hu et al. Eq. 8)."""

    alpha: float  # 1 + P(H*) - Q(H*)
    H: tuple[int, ...]  # token ids of H*, ascending (the first minimising prefix)
    P_H: float  # target mass P(H*)
    Q_H: float  # Prob[all drafts in H*]
    scheme: str
    n: int


@dataclass(frozen=True)
class PrefixCurve:
    """The scan of Hu et al. §4.2.1: P and Q on the prefixes H_i = order[:i], i = 0..m."""

    order: torch.Tensor  # (m,) token ids (support of p or q only)
    P: torch.Tensor  # (m+1,) P(H_i)
    Q: torch.Tensor  # (m+1,) Q(H_i)


# --------------------------------------------------------------------------- inputs


def _dist(x: torch.Tensor, name: str) -> torch.Tensor:
    """Validated float64 copy of a 1-D distribution, renormalised."""
    x = torch.as_tensor(x).detach().to(F64).flatten()  # (V,)
    if x.numel() == 0 or not bool(torch.isfinite(x).all()) or bool((x < 0).any()):
        raise ValueError(f"{name} must be a non-empty, finite, non-negative (V,) tensor")
    total = float(x.sum())
    if total <= 0.0:
        raise ValueError(f"{name} has no mass")
    return x / total


def _inputs(p, q, n: int, scheme: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Checked (p, q) float64 pair for n drafts."""
    p, q = _dist(p, "p"), _dist(q, "q")
    if p.shape != q.shape:
        raise ValueError(f"p and q differ in shape: {tuple(p.shape)} vs {tuple(q.shape)}")
    if int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if scheme is not None and scheme not in SCHEMES:
        raise ValueError(f"unknown draft scheme {scheme!r}; expected one of {SCHEMES}")
    return p, q


def tv_distance(p: torch.Tensor, q: torch.Tensor) -> float:
    """Total variation 1/2 sum |p - q|; single-draft alpha* = 1 - TV (Hu et al. §2.2)."""
    p, q = _inputs(p, q, 1)
    return 0.5 * float((p - q).abs().sum())


# ------------------------------------------------------------------- prefix Q, per scheme


def ratio_order(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Tokens with p + q > 0 sorted by q/p decreasing (p = 0 -> +inf), Hu et al. §4.2.1."""
    support = torch.nonzero((p > 0) | (q > 0)).flatten()  # (m,)
    ps, qs = p[support], q[support]
    ratio = torch.where(ps > 0, qs / ps.clamp_min(1e-300), torch.inf)  # (m,)
    return support[torch.sort(ratio, descending=True, stable=True).indices]


def _q_with(qs: torch.Tensor, n: int) -> torch.Tensor:
    """Q(H_i) = q(H_i)^n for i = 0..m (Hu et al. §4.2.2, with replacement)."""
    return torch.cat([qs.new_zeros(1), torch.cumsum(qs, 0)]).clamp(max=1.0) ** n


def _q_without_two(qs: torch.Tensor) -> torch.Tensor:
    """Exact n = 2 sequential Q: sum_{a in H} q_a q(H - a) / (1 - q_a) (docs/derivations.md,
    Optimal multi-draft).

    1 - q_a is summed over the other tokens for the largest q (only it can cancel), and the
    largest token's own term is kept apart so q(H - a) never cancels either.
    """
    d = int(torch.argmax(qs))
    rest = qs.clone()
    rest[d] = 0.0  # (m,) q without the dominant token
    comp = (1.0 - qs).clamp_min(0.0)  # (m,) 1 - q_a, accurate for q_a <= 1/2
    comp[d] = rest.sum()
    zero = qs.new_zeros(1)
    s_rest = torch.cat([zero, torch.cumsum(rest, 0)])  # (m+1,) q(H - d)
    a = torch.cat([zero, torch.cumsum(rest / comp, 0)])  # (m+1,)
    b = torch.cat([zero, torch.cumsum(rest * rest / comp, 0)])  # (m+1,)
    has_d = (torch.arange(qs.numel() + 1) > d).to(F64)  # (m+1,) d in H_i
    q_h = s_rest + has_d * qs[d]
    dominant = has_d * qs[d] * s_rest / comp[d] if comp[d] > 0 else 0.0 * has_d
    return q_h * a - b + dominant


def _q_without_enum(qs: torch.Tensor, n: int) -> torch.Tensor:
    """Exact sequential Q(H_i) by enumerating ordered draws; Q(H_i) = CDF of the max position."""
    qv = qs.tolist()
    mass_at_max = [0.0] * (len(qv) + 1)

    def walk(left: tuple[int, ...], prob: float, top: int, k: int) -> None:
        if k == 0:
            mass_at_max[top + 1] += prob
            return
        norm = math.fsum(qv[j] for j in left)  # normaliser as a sum, never 1 - q(S)
        for x in left:
            rest = tuple(j for j in left if j != x)
            walk(rest, prob * qv[x] / norm, max(top, x), k - 1)

    walk(tuple(i for i, x in enumerate(qv) if x > 0), 1.0, -1, n)
    return torch.tensor(list(itertools.accumulate(mass_at_max)), dtype=F64).clamp(max=1.0)


def _clock_grid(m: int, n: int, light_mass: float) -> tuple[torch.Tensor, float]:
    """Nodes t_k = e^{u_k} of a trapezoid rule in u = log t, and the step h.

    Below t_0 the integrand of 1 - Q is e^{-rt} up to Prob[N >= n] <= t^n / n! (summed in
    closed form by _clock_tail). Above t_hi every prefix's integrand is below
    C(m, n-1) e^{-L t}, L = light mass <= 1 - q(top n-1 of H), so it is ~e^{-40}.
    """
    t_0 = (1e-12 * math.factorial(n)) ** (1.0 / (n + 1))
    t_hi = (40.0 + (n - 1) * math.log(max(m, 2))) / light_mass
    k = int(math.ceil(math.log(t_hi / t_0) / CLOCK_STEP)) + 1
    u = torch.linspace(math.log(t_0), math.log(t_hi), k, dtype=F64)  # (K,)
    return torch.exp(u), float(u[1] - u[0])


def _clock_tail(r: torch.Tensor, t_0: float, h: float, terms: int = 8) -> torch.Tensor:
    """Virtual nodes t_j = t_0 e^{-jh}, j >= 1: sum_j h t_j e^{-r t_j} by its Taylor series.

    sum_a (-r)^a / a! * h sum_j t_j^{a+1}, by Horner; r t_0 <= 0.02, so 8 terms reach 1e-17.
    """
    out = torch.zeros_like(r)  # (m,)
    for a in reversed(range(terms)):
        nodes = h * t_0 ** (a + 1) * math.exp(-(a + 1) * h) / -math.expm1(-(a + 1) * h)
        out = out.mul_(-r).add_(nodes / math.factorial(a))
    return out


def _q_without_clock(qs: torch.Tensor, n: int) -> torch.Tensor:
    """Sequential Q(H_i), n >= 3, by the exponential-clock integral (docs/derivations.md,
    Optimal multi-draft).

    1 - Q(H) = r int_0^inf e^{-rt} Prob[N_H(t) < n] dt, r = q(outside H), N_H(t) = arrivals
    by time t of independent Exp(q_i) clocks in H. With the n-1 largest-q tokens ("heavy")
    split off, e^{-rt} Prob[N_H(t) < n] = sum_{J, k} prod_{h in J}(1 - e^{-q_h t})
    e^{-(1 - q(J)) t} e_k(e^{q_j t} - 1 : light j in H) over heavy J in H, |J| + k < n.
    e_k comes from prefix power sums (Newton's identities) of w_j = (e^{q_j t} - 1) e^{-l t},
    l = max light q, so w <= 1 and every exponent stays <= 0 (J plus k light tokens never
    outweigh the heavy set): no overflow and no cancellation beyond float64 rounding.
    """
    m = qs.numel()
    heavy = torch.topk(qs, n - 1).indices  # (n-1,) positions in the prefix order
    light = qs.clone()
    light[heavy] = 0.0  # (m,)
    ell, light_mass, q_heavy = float(light.max()), float(light.sum()), qs[heavy]
    suffix = torch.flip(torch.cumsum(torch.flip(qs, [0]), 0), [0])  # (m,) q(order[i:])
    r = torch.cat([suffix[1:], qs.new_zeros(1)])  # (m,) r(H_i) for i = 1..m
    t, h = _clock_grid(m, n, light_mass)
    subsets = [[b for b in range(n - 1) if mask >> b & 1] for mask in range(1 << (n - 1))]
    weights = _clock_weights(t, h * t, subsets, q_heavy, light_mass, ell, n)  # (n, nJ, K)
    y = qs.new_zeros(m, len(subsets))  # (m, nJ) sum_t weight * e_k, every prefix
    y_top = torch.zeros_like(y)  # (m, nJ) the linear p_{n-1} part of e_{n-1}, before prefix sums
    carry = [qs.new_zeros(t.numel(), 1) for _ in range(n - 2)]  # power sums of earlier blocks
    block = max(1024, CLOCK_BLOCK // t.numel())
    for lo in range(0, m, block):
        w = _light_w(light[lo:lo + block] - ell, ell, t[:, None], n)  # (K, mb)
        nonlinear, power = _newton(w, n - 1, carry)
        for k, e_k in enumerate(nonlinear, start=1):
            if e_k is not None:
                y[lo:lo + block].addmm_(e_k.T, weights[k].T)
        y_top[lo:lo + block] = power.T @ weights[n - 1].T
    y += weights[0].sum(1) + torch.cumsum(y_top, 0) * ((-1.0) ** (n - 2) / (n - 1))
    y = y.T  # (nJ, m)
    pos = torch.arange(1, m + 1)  # (m,) prefix length i
    inside = [max((int(heavy[b]) for b in s), default=-1) for s in subsets]
    s_grid = sum(torch.where(pos > j_pos, y[j], 0.0) for j, j_pos in enumerate(inside))
    q_pref = 1.0 - r * (s_grid + _clock_tail(r, float(t[0]), h))  # (m,)
    return torch.cat([qs.new_zeros(1), q_pref]).clamp(0.0, 1.0)


def _clock_weights(t, wt, subsets, q_heavy, light_mass, ell, n) -> torch.Tensor:
    """(n, nJ, K) weights wt e^{-rho t} prod_{h in J}(1 - e^{-q_h t}), zero when |J| + k >= n."""
    out = t.new_zeros(n, len(subsets), t.numel())
    for j, s in enumerate(subsets):
        arrived = torch.ones_like(t)
        for b in s:
            arrived = arrived * -torch.expm1(-q_heavy[b] * t)  # (K,)
        not_j = float(q_heavy[[b for b in range(n - 1) if b not in s]].sum())
        for k in range(n - len(s)):
            rho = light_mass + (not_j - k * ell)  # = q(outside J) - k l >= light mass > 0
            decay = torch.where(rho * t < EXP_FLOOR, torch.exp(-rho * t), 0.0)
            out[k, j] = wt * decay * arrived
    return out


def _light_w(shift: torch.Tensor, ell: float, tc: torch.Tensor, n: int) -> torch.Tensor:
    """(K, mb) w_j = (e^{q_j t} - 1) e^{-l t} = e^{(q_j - l) t} - e^{-l t}, t = tc (K, 1).

    Exponents are floored at -EXP_FLOOR / (n-1) so that w^(n-1) stays a normal float; a w
    whose both exponents fall below the floor becomes exactly 0 (it is < 1e-100 anyway).
    """
    floor = -EXP_FLOOR / (n - 1)
    x = torch.mul(shift, tc)  # (K, mb); shift >= -l, so -l t is the smallest exponent
    if -ell * float(tc[-1]) < floor:
        x.clamp_(min=floor)
    return x.exp_().sub_(torch.exp((-ell * tc).clamp(min=floor)))


def _newton(w: torch.Tensor, top: int,
            carry: list[torch.Tensor]) -> tuple[list[torch.Tensor | None], torch.Tensor]:
    """e_1..e_top of every prefix ending in this block: k e_k = sum (-1)^{i-1} e_{k-i} p_i.

    p_i are prefix power sums; carry[i-1] (K, 1) holds p_i of the earlier blocks and is
    advanced in place. e_top comes without its linear term (-1)^{top-1} p_top / top (None if
    nothing else is left): the caller contracts w^top (returned) over the grid and prefix-sums
    it afterwards, which saves one (K, mb) cumsum.
    """
    power, sums, elem = w, [], []
    for k in range(1, top + 1):
        power = w if k == 1 else power * w  # (K, mb) w^k
        acc = None
        if k < top:
            sums.append(torch.cumsum(power, 1).add_(carry[k - 1]))  # (K, mb) p_k
            carry[k - 1] = sums[-1][:, -1:].clone()
            coef = (-1.0) ** (k - 1) / k  # the i = k term (e_0 = 1); e_1 = p_1 is not copied
            acc = sums[-1] if k == 1 else sums[-1] * coef
        for i in range(1, k):
            coef = (-1.0) ** (i - 1) / k
            if acc is None:
                acc = torch.mul(sums[i - 1], elem[k - i - 1]).mul_(coef)
            else:
                acc.addcmul_(sums[i - 1], elem[k - i - 1], value=coef)
        elem.append(acc)
    return elem, power


def _q_without(qs: torch.Tensor, n: int) -> torch.Tensor:
    """Exact sequential without-replacement Q(H_i), i = 0..m; min(n, |supp q|) drafts."""
    support = int((qs > 0).sum())
    n = min(n, support)
    if n == support:  # every supported token is drafted
        count = torch.cat([qs.new_zeros(1), torch.cumsum((qs > 0).to(F64), 0)])
        return (count == support).to(F64)  # (m+1,)
    if n == 1:
        return _q_with(qs, 1)
    if n == 2:
        return _q_without_two(qs).clamp(0.0, 1.0)
    if math.perm(support, n) <= ENUM_LIMIT:
        return _q_without_enum(qs, n)
    return _q_without_clock(qs, n)


def _greedy_curve(p: torch.Tensor, q: torch.Tensor, n: int) -> PrefixCurve:
    """Greedy drafts (Hu et al. Thm. 7 proof): Q(H) = q'(H) if T in H else 0.

    Order T first, then the rest by q'/p decreasing; the minimiser T + {q' > p} is a prefix.
    """
    top = greedy_top(q, n)
    q_rest = without(q, top.tolist())  # (V,)
    rest = ratio_order(p, q_rest)
    rest = rest[~torch.isin(rest, top)]
    order = torch.cat([top, rest])  # (m,)
    zero = p.new_zeros(1)
    if float(q_rest.sum()) > 0.0:
        q_pref = torch.cat([zero, torch.cumsum(q_rest[order], 0)]).clamp(max=1.0)
    else:  # supp q inside T: the drafts are T itself
        q_pref = torch.ones(order.numel() + 1, dtype=F64)
    q_pref[: top.numel()] = 0.0  # T not yet inside H_i
    return PrefixCurve(order, torch.cat([zero, torch.cumsum(p[order], 0)]), q_pref)


def prefix_curve(p: torch.Tensor, q: torch.Tensor, n: int, scheme: str) -> PrefixCurve:
    """P(H_i), Q(H_i) on the prefixes the alpha* scan visits (Hu et al. §4.2.1).

    The dual certificate curve: f = P - Q along the prefixes, and 1 - alpha* = -min f.

    Args:
        p, q: (V,) target / draft distributions.
        n: number of drafts.
        scheme: one of SCHEMES.
    """
    p, q = _inputs(p, q, n, scheme)
    if scheme == "greedy":
        return _greedy_curve(p, q, n)
    order = ratio_order(p, q)  # (m,)
    qs = q[order]
    q_pref = _q_with(qs, n) if scheme == "with_replacement" else _q_without(qs, n)
    return PrefixCurve(order, torch.cat([p.new_zeros(1), torch.cumsum(p[order], 0)]), q_pref)


def scan_certificate(curve: PrefixCurve, scheme: str, n: int) -> OptimalResult:
    """alpha* = 1 + min_i [P(H_i) - Q(H_i)] (Hu et al. Eq. 8) and its certificate H*.

    H* is the shortest prefix within CERT_TOL of the minimum, so rounding noise (p == q gives
    f = -1e-16 on the full set) does not turn into a spurious certificate.
    """
    f = curve.P.clamp(max=1.0) - curve.Q  # (m+1,); f[0] = 0 so alpha* <= 1
    i = int(torch.nonzero(f <= f.min() + CERT_TOL)[0])
    alpha = min(1.0, max(0.0, 1.0 + float(f[i])))
    inside = torch.zeros(int(curve.order.max()) + 1 if i else 0, dtype=torch.bool)
    inside[curve.order[:i]] = True  # a mask instead of a sort: ascending ids in O(V)
    h_star = tuple(torch.nonzero(inside).flatten().tolist())
    return OptimalResult(alpha, h_star, float(curve.P[i]), float(curve.Q[i]), scheme, int(n))


def alpha_star(p: torch.Tensor, q: torch.Tensor, n: int, scheme: str) -> OptimalResult:
    """Optimal acceptance of n drafts from q under `scheme` for target p (Hu et al. Eq. 8).

    Args:
        p: (V,) target distribution (float32 or float64; renormalised).
        q: (V,) draft distribution.
        n: number of drafts (without replacement / greedy use at most |supp q| of them).
        scheme: "with_replacement", "without_replacement" or "greedy".
    Returns:
        OptimalResult with alpha* and the certificate H*.
    """
    return scan_certificate(prefix_curve(p, q, n, scheme), scheme, n)


# ---------------------------------------------------------- verifier acceptance rates


def rrs_wr_acceptance(p: torch.Tensor, q: torch.Tensor, n: int) -> float:
    """Expected acceptance of RRS with i.i.d. drafts (Hu et al. App. A.1; MCSD App. C).

    alpha = sum_k a_k prod_{j<k} (1 - a_j), a_k = sum_i min(p_k(i), q(i)),
    p_1 = p, p_{k+1} = Res^{p_k - q}.
    """
    p_k, q = _inputs(p, q, n)
    alpha, stay = 0.0, 1.0
    for _ in range(n):
        a = float(torch.minimum(p_k, q).sum())
        alpha, stay = alpha + stay * a, stay * (1.0 - a)
        res = (p_k - q).clamp_min(0.0)  # (V,)
        if float(res.sum()) <= 0.0:
            break
        p_k = res / res.sum()
    return min(1.0, alpha)


def kseq_acceptance(p: torch.Tensor, q: torch.Tensor, n: int) -> float:
    """Expected K-SEQ acceptance 1 - (1 - beta(rho))^n (Hu et al. App. A.2)."""
    p, q = _inputs(p, q, n)
    return 1.0 - (1.0 - kseq_beta(p, q, kseq_rho(p, q, n))) ** n


def greedy_drafts_acceptance(p: torch.Tensor, q: torch.Tensor, n: int) -> float:
    """Greedy drafts' verifier acceptance P(T) + sum_i min(p(i), q'(i)) (Hu et al. Thm. 7)."""
    p, q = _inputs(p, q, n)
    top = greedy_top(q, n)
    return min(1.0, float(p[top].sum() + torch.minimum(p, without(q, top.tolist())).sum()))
