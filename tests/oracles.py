"""Test oracles: plain, obviously-correct versions of what the library computes another way.

They live here, not in ``fedpriv``, because only tests call them (issue 25: no unreferenced
library function). Each names the library code it checks:

* ``tree_prefix_noise``: the tree's total prefix noise ``n(t)`` (``fedpriv.dp.noise``'s
  increments must telescope to it);
* ``distributed_noise_share``: one client's share of Gaussian noise under secure aggregation;
* ``noise_covariance``: ``sigma^2 C^{-1} C^{-T}`` of an MF strategy (``fedpriv.dp.matrix``);
* ``expected_error_variance``: the DDG round's expected squared error (``fedpriv.dp.ddg``);
* ``make_client_update`` / ``cohort_sum``: one client's local SGD as a ``lax.scan`` over its
  padded batches, ``vmap``-ped over a padded cohort (the engine's packed lanes,
  ``fedpriv.fl.aggregate.packed_sum``, must give the same sum);
* ``discrete_gaussian_variance``: the exact variance of ``N_Z(0, sigma^2)`` (``fedpriv.dp.ddg``'s
  sampler is checked against it);
* ``teacher_logits`` / ``params_fingerprint``: the teacher's full-vocabulary forward on one batch
  and a fingerprint for teachers built in a test (``fedpriv.models.llama``'s bucketed top-k
  scoring is checked against the full logits);
* ``student_batches``: shuffled, padded distillation batches (``fedpriv.public.distill``);
* ``format_source_report``: ``fedpriv.public.select.source_shares`` as a Markdown table;
* ``pipeline_events``: the FreD pipeline ledger's events without running it
  (``fedpriv.recipes.fred_pipeline``);
* ``rdp_epsilon`` / ``pld_epsilon``: raw ``dp_accounting`` accountants on a list of events (the
  ledger's and the plans' accountant choice, ``fedpriv.dp.accounting.compute_epsilon``);
* ``gaussian_epsilon``: the exact epsilon of one Gaussian mechanism (Balle & Wang 2018, Thm. 8),
  by bisection on its closed-form delta;
* ``per_pass_event``: a shuffled-pass run written out one pass at a time (the declared
  population's event, ``fedpriv.dp.population``; the shuffled samplers' ``periodic_event``);
* ``executed_noise_cohort_event``: the event of a run that trains ``m`` clients per round at
  the noise of ``M`` (``noise_cohort_size``, ``fedpriv.dp.mechanisms``);
* ``observed_min_separation``: the smallest gap between two rounds of one client, read off a
  sampler's cohorts (``fedpriv.fl.samplers``' declared ``min_separation``);
* ``discrete_gaussian_sum_renyi``: the exact Renyi divergence of a sum of discrete Gaussians
  against its shift by an integer vector, by brute-force convolution, and
  ``prop14_rdp_closed_form``: Kairouz et al. 2021's Prop. 14 bound as the paper states it
  (``fedpriv.dp.ddg.prop14_rdp`` must equal the second and bound the first);
* ``float32_norm_error_bound``: a rigorous bound on the relative error of a float32 norm
  computed as ``sqrt(fn(x))``, from the summations ``fn`` actually traces
  (``fedpriv.dp.ddg.norm_error`` must not be below it);
* ``geometric_composition_epsilon``: the exact epsilon of k Geometric (discrete Laplace)
  releases at delta, from their privacy loss distribution by exact convolution
  (``fedpriv.dp.accounting``'s paths must not be below it).
"""
from __future__ import annotations

import hashlib
import math
from typing import Any, Callable, Iterable, Mapping

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
import optax
from scipy import optimize, special
from scipy.special import logsumexp

from fedpriv.dp.clipping import clip_update
from fedpriv.dp.ddg import DDGConfig, DDGRound
from fedpriv.dp.noise import node_noise, noise_like
from fedpriv.fl.aggregate import client_weight
from fedpriv.models.llama import Teacher, _forward_jit
from fedpriv.recipes import lm as lm_recipe
from fedpriv.recipes.fred_pipeline import fred_release_event


def tree_prefix_noise(key, t, like, std, num_levels: int):
    """Total noise ``n(t)`` on the prefix sum of the first ``t`` leaves (``t >= 0``).

    ``n(t) = sum over set bits h of t of node_noise(level=h, index=(t >> h) - 1)``;
    ``n(0) = 0``. ``num_levels`` (static) bounds the levels examined.
    """
    total = jax.tree_util.tree_map(jnp.zeros_like, like)
    for h in range(num_levels):
        bit = (t >> h) & 1
        z = node_noise(key, h, jnp.maximum((t >> h) - 1, 0), like, std)
        total = jax.tree_util.tree_map(lambda a, b: a + jnp.where(bit == 1, b, 0), total, z)
    return total


def distributed_noise_share(key, like: Any, std: float, num_clients):
    """One client's share of distributed Gaussian noise under secure aggregation: each of
    ``num_clients`` clients adds ``N(0, std^2 / num_clients)`` per coordinate, so the securely
    aggregated sum of the shares is ``N(0, std^2)``."""
    return noise_like(key, like, std / jnp.sqrt(jnp.asarray(num_clients, jnp.float32)))


def noise_covariance(strategy, n: int, noise_std: float = 1.0) -> np.ndarray:
    """Covariance ``sigma^2 C^{-1} C^{-T}`` ``[n, n]`` of the per-round noise (per coordinate)."""
    cinv = np.linalg.inv(strategy.matrix(n))
    return noise_std ** 2 * cinv @ cinv.T


def expected_error_variance(cfg: DDGConfig, result: DDGRound) -> float:
    """``E ||decoded - clipped_sum||^2`` over rounding and noise (rotation is orthogonal):
    ``gamma^2 (sum p (1 - p) + survivors * D * Var N_Z(0, sigma_int^2))`` (padding included;
    the decoded sum drops the padding, so compare over the full rotated space or d = D)."""
    noise = result.num_survivors * cfg.padded_dim * discrete_gaussian_variance(cfg.local_sigma)
    return cfg.gamma ** 2 * (result.rounding_variance + noise)


def _where(pred, new, old):
    return jax.tree_util.tree_map(lambda a, b: jnp.where(pred, a, b), new, old)


def make_client_update(loss_fn: Callable, optimizer: optax.GradientTransformation,
                       local_epochs: int = 1):
    """``update(params, batches[S, B, ...], rng) -> (delta, aux_sums, num_examples)``: the optax
    ``optimizer`` over one client's padded batches with ``lax.scan`` (``batches['mask']:
    float32[S, B]``; an all-zero step is a no-op), ``delta = params_after - params``."""
    if local_epochs < 1:
        raise ValueError(f"local_epochs must be >= 1, got {local_epochs}")
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def update(params, batches, rng):
        steps = batches["mask"].shape[0]
        step_real = jnp.sum(batches["mask"], axis=1) > 0            # [S]
        opt_state = optimizer.init(params)

        def step(carry, xs):
            p, s = carry
            batch, real, i = xs
            (_, aux), g = grad_fn(p, batch, jax.random.fold_in(rng, i))
            upd, s_new = optimizer.update(g, s, p)
            p_new = optax.apply_updates(p, upd)
            aux = jax.tree_util.tree_map(lambda a: jnp.where(real, a, jnp.zeros_like(a)), aux)
            return (_where(real, p_new, p), _where(real, s_new, s)), aux

        carry = (params, opt_state)
        aux_total = None
        for e in range(local_epochs):
            idx = jnp.arange(steps) + e * steps
            carry, aux = jax.lax.scan(step, carry, (batches, step_real, idx))
            aux = jax.tree_util.tree_map(lambda a: jnp.sum(a, axis=0), aux)
            aux_total = aux if aux_total is None else jax.tree_util.tree_map(jnp.add, aux_total, aux)
        delta = jax.tree_util.tree_map(jnp.subtract, carry[0], params)
        return delta, aux_total, jnp.sum(batches["mask"])

    return update


def cohort_sum(client_update, params, batches, client_mask, rng, clip_norm,
               weighting: str = "uniform", weight_cap: float = 256.0, chunk_size: int | None = None):
    """Sum of clipped, weighted client updates over a padded cohort.

    Args:
      client_update: ``(params, batches[S,B,...], rng) -> (delta, aux, num_examples)``.
      params: server parameters (replicated).
      batches: dict of ``[K, S, B, ...]`` arrays incl. ``mask``.
      client_mask: float32[K], 1 for real clients.
      rng: PRNG key of the round; client k uses ``fold_in(rng, k)``.
      clip_norm: scalar C (``inf`` = no clipping).

    Returns:
      ``(sum_tree, stats)``: ``sum_tree = sum_k keep_k w_k clip(delta_k)``; ``stats`` has the
      summed ``aux`` metrics (real clients only), ``weight_sum``, ``norm_sum``,
      ``num_clipped``, ``num_nonfinite``, ``num_clients`` and per-client ``norms: float32[K]``.
    """
    K = client_mask.shape[0]

    def one(xs):
        b, cmask, idx = xs
        delta, aux, nex = client_update(params, b, jax.random.fold_in(rng, idx))
        clipped, norm, finite = clip_update(delta, clip_norm)
        w = client_weight(nex, weighting, weight_cap) * cmask * finite.astype(jnp.float32)
        contrib = jax.tree_util.tree_map(lambda x: x * w.astype(x.dtype), clipped)
        aux = jax.tree_util.tree_map(lambda a: a * cmask.astype(a.dtype), aux)
        stats = {"weight_sum": w, "norm_sum": jnp.where(finite, norm, 0.0) * cmask,
                 "num_clipped": (finite & (norm > clip_norm)).astype(jnp.float32) * cmask,
                 "num_nonfinite": (~finite).astype(jnp.float32) * cmask, "num_clients": cmask}
        return contrib, aux, stats, norm

    xs = (batches, client_mask, jnp.arange(K))
    if chunk_size is None or chunk_size >= K:
        contrib, aux, stats, norms = jax.vmap(one)(xs)
        total = jax.tree_util.tree_map(lambda a: jnp.sum(a, axis=0), (contrib, aux, stats))
    else:
        if K % chunk_size:
            raise ValueError(f"cohort capacity {K} must be a multiple of chunk_size {chunk_size}")
        chunked = jax.tree_util.tree_map(lambda a: a.reshape((K // chunk_size, chunk_size) + a.shape[1:]), xs)

        def body(carry, chunk):
            c, a, s, n = jax.vmap(one)(chunk)
            part = jax.tree_util.tree_map(lambda v: jnp.sum(v, axis=0), (c, a, s))
            return jax.tree_util.tree_map(jnp.add, carry, part), n

        zero = jax.eval_shape(lambda: jax.tree_util.tree_map(
            lambda v: jnp.sum(v, axis=0), jax.vmap(one)(jax.tree_util.tree_map(lambda a: a[0], chunked))[:3]))
        zero = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), zero)
        total, norms = jax.lax.scan(body, zero, chunked)
        norms = norms.reshape(K)
    contrib_sum, aux_sum, stats = total
    stats = dict(stats, norms=norms, **{"aux": aux_sum})
    return contrib_sum, stats


def discrete_gaussian_variance(sigma: float) -> float:
    """Exact variance of ``N_Z(0, sigma^2)`` (slightly below ``sigma^2`` for small sigma)."""
    if sigma == 0:
        return 0.0
    k = np.arange(-int(40 * sigma) - 40, int(40 * sigma) + 41, dtype=np.float64)
    w = np.exp(-k ** 2 / (2 * sigma ** 2))
    return float((k ** 2 * w).sum() / w.sum())


def teacher_logits(teacher: Teacher, token_ids, mask=None) -> jax.Array:
    """Jitted forward on one (already padded) batch.

    Args:
      token_ids: int32[B, L] teacher ids, right-padded. mask: float32[B, L] (None = all real).

    Returns:
      float32[B, L, V] logits; position i predicts token i+1.
    """
    token_ids = jnp.asarray(token_ids, jnp.int32)
    if mask is None:
        mask = jnp.ones(token_ids.shape, jnp.float32)
    return _forward_jit(teacher.params, teacher.config, token_ids,
                        jnp.asarray(mask, jnp.float32))


def params_fingerprint(params) -> str:
    """Hex sha256 of a params pytree's bytes (for teachers not loaded from a file)."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        a = np.asarray(leaf)
        h.update(str((a.shape, a.dtype.str)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def student_batches(arrays: Mapping[str, np.ndarray], batch_size: int, rng: np.random.Generator,
                    *, drop_remainder: bool = False) -> Iterable[dict[str, np.ndarray]]:
    """One shuffled epoch of distillation batches from `corpus_to_student` arrays.

    The last partial batch is padded to `batch_size` with mask-0 rows (PAD tokens, no teacher),
    so every batch has the same shape; or dropped with `drop_remainder`. Host-side shuffling with
    an explicit NumPy generator.
    """
    n = len(arrays["tokens"])
    order = rng.permutation(n)
    for start in range(0, n, batch_size):
        idx = order[start:start + batch_size]
        if len(idx) < batch_size and drop_remainder:
            return
        batch = {name: a[idx] for name, a in arrays.items()}
        short = batch_size - len(idx)
        if short:
            batch = {name: np.concatenate(
                [a, np.full((short, *a.shape[1:]),
                            -np.inf if name == "topk_logits" else 0, a.dtype)])
                for name, a in batch.items()}
        yield batch


def format_source_report(shares: dict[Any, dict[str, float]]) -> str:
    """Markdown table of `source_shares` output."""
    lines = ["| source | pool | share of pool | selected | share of selected | lift |",
             "|---|---:|---:|---:|---:|---:|"]
    for label, r in shares.items():
        lines.append(f"| {label} | {r['pool_count']} | {r['pool_share']:.1%} | "
                     f"{r['selected_count']} | {r['selected_share']:.1%} | {r['lift']:.2f} |")
    return "\n".join(lines)


def pipeline_events(cfg, num_clients: int) -> tuple[list[dpa.DpEvent], float]:
    """The pipeline ledger's events without running it: ``([FreD release, FL-finetuning], z)``,
    z calibrated (``target_epsilon``) so that both fit the budget, for ``num_clients`` FL users."""
    fred_event = fred_release_event(cfg)
    task = lm_recipe.build_task(cfg.lm, cfg.lm.vocab_size)
    _, _, fl_event, z = lm_recipe.build_algorithm(cfg.lm, num_clients, task.loss_fn, [fred_event])
    return [fred_event, fl_event], z


# ----------------------------------------------------------------------------- accounting
def rdp_epsilon(events: Iterable[dpa.DpEvent], delta: float, neighboring: str = "add_remove") -> float:
    """Epsilon at ``delta`` of the composition of ``events`` by ``dp_accounting``'s own
    ``RdpAccountant`` (REPLACE_SPECIAL for add/remove, as the trees need; REPLACE_ONE else)."""
    rel = (dpa.NeighboringRelation.REPLACE_SPECIAL if neighboring == "add_remove"
           else dpa.NeighboringRelation.REPLACE_ONE)
    acc = dpa.rdp.RdpAccountant(neighboring_relation=rel)
    for ev in events:
        acc.compose(ev)
    return float(acc.get_epsilon(delta))


def pld_epsilon(events: Iterable[dpa.DpEvent], delta: float) -> float:
    """Epsilon at ``delta`` of the composition of ``events`` by ``dp_accounting``'s own
    ``PLDAccountant`` (add/remove one)."""
    acc = dpa.pld.PLDAccountant(dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
    for ev in events:
        acc.compose(ev)
    return float(acc.get_epsilon(delta))


def gaussian_epsilon(sigma: float, delta: float) -> float:
    """The exact epsilon of the Gaussian mechanism of multiplier ``sigma`` (noise std over L2
    sensitivity) at ``delta``: the root of Balle & Wang 2018 (Thm. 8)
    ``delta(eps) = Phi(1/(2 sigma) - eps sigma) - e^eps Phi(-1/(2 sigma) - eps sigma)``
    (decreasing in eps), found by bisection; 0 if ``delta(0) <= delta``."""
    def excess(eps):
        a = special.ndtr(0.5 / sigma - eps * sigma)
        b = np.exp(eps + special.log_ndtr(-0.5 / sigma - eps * sigma))
        return a - b - delta
    if excess(0.0) <= 0:
        return 0.0
    hi = 1.0
    while excess(hi) > 0:
        hi *= 2
    return float(optimize.brentq(excess, 0.0, hi, xtol=1e-14, rtol=1e-13))


def per_pass_event(noise_multiplier: float, rounds: int, rounds_per_epoch: int,
                   mechanism: str) -> dpa.DpEvent:
    """``rounds`` rounds in which every user is in at most one round of each pass of
    ``rounds_per_epoch`` rounds, written out pass by pass: ``"tree"``: one
    ``SingleEpochTreeAggregationDpEvent`` per pass (its leaves: the pass's rounds, the last
    pass the remainder); ``"gaussian"``: one ``GaussianDpEvent`` per pass."""
    z, left, passes = float(noise_multiplier), int(rounds), []
    while left > 0:
        leaves = min(left, int(rounds_per_epoch))
        passes.append(dpa.SingleEpochTreeAggregationDpEvent(z, leaves) if mechanism == "tree"
                      else dpa.GaussianDpEvent(z))
        left -= leaves
    return dpa.ComposedDpEvent(passes)


def executed_noise_cohort_event(noise_multiplier: float, sampling_rate: float, cohort: float,
                                noise_cohort: int, rounds: int) -> dpa.DpEvent:
    """A Poisson run that trains ``cohort`` clients per round (expected) but adds the noise of
    ``noise_cohort``: the noise std on the cohort's sum is ``z C cohort / noise_cohort`` at
    sensitivity ``C``, so each round is a Poisson-sampled Gaussian of multiplier
    ``z cohort / noise_cohort``, ``rounds`` times."""
    z = float(noise_multiplier) * float(cohort) / float(noise_cohort)
    return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(float(sampling_rate), dpa.GaussianDpEvent(z)),
                                   int(rounds))


def observed_min_separation(sampler, rounds: int) -> float:
    """The smallest number of rounds between two participations of one client in the cohorts
    ``sampler.sample(0..rounds-1)`` (``inf`` if no client is sampled twice)."""
    last: dict[int, int] = {}
    gap = float("inf")
    for t in range(int(rounds)):
        for c in np.asarray(sampler.sample(t)).tolist():
            if c in last:
                gap = min(gap, t - last[c])
            last[c] = t
    return gap
# ----------------------------------------------------------------------------- DDG (Kairouz et al. 2021)
def _log_discrete_gaussian(sigma: float) -> tuple[int, np.ndarray]:
    """``(K, log pmf [2K + 1])`` of ``N_Z(0, sigma^2)`` on ``[-K, K]`` (``K = 40 sigma + 40``:
    the mass left out is below ``exp(-800)``)."""
    K = int(math.ceil(40 * sigma)) + 40
    lw = -np.arange(-K, K + 1, dtype=np.float64) ** 2 / (2 * sigma ** 2)
    return K, lw - logsumexp(lw)


def discrete_gaussian_sum_log_pmf(sigma: float, n: int) -> np.ndarray:
    """Log pmf ``[2 n K + 1]`` (support ``-nK .. nK``) of the sum of ``n`` i.i.d.
    ``N_Z(0, sigma^2)``, by ``n - 1`` exact convolutions in log space (no tail is lost to
    float64 underflow)."""
    _, lp = _log_discrete_gaussian(sigma)
    out = lp
    for _ in range(int(n) - 1):
        conv = np.full(len(out) + len(lp) - 1, -np.inf)
        for i, v in enumerate(out):
            conv[i:i + len(lp)] = np.logaddexp(conv[i:i + len(lp)], v + lp)
        out = conv
    return out


def discrete_gaussian_sum_renyi(alpha: float, sigma: float, n: int, shift) -> float:
    """Exact ``D_alpha(Z_n + shift || Z_n)`` for ``Z_n`` the sum of ``n`` i.i.d. discrete
    Gaussians ``N_Z(0, sigma^2)`` per coordinate and ``shift`` an integer vector (the coordinates
    are independent, so the divergence is the sum of the 1-D ones; each one symmetric in the
    sign of its shift). What Prop. 14 of Kairouz et al. 2021 bounds: ``prop14_rdp`` must not be
    below it."""
    lp = discrete_gaussian_sum_log_pmf(sigma, n)
    total = 0.0
    for s in np.abs(np.asarray(shift, np.int64)).ravel():
        s = int(s)
        if s == 0:
            continue
        if s >= len(lp):
            return math.inf
        shifted, base = lp[:-s], lp[s:]  # P(x - s) and P(x) on the common support
        total += float(logsumexp(alpha * shifted + (1 - alpha) * base)) / (alpha - 1)
    return total


def prop14_rdp_closed_form(alpha: float, sigma: float, l2: float, l1: float, dim: int,
                           n: int) -> float:
    """Kairouz, Liu & Steinke 2021, Prop. 14, as stated there: for ``sigma >= 1/2`` and ``n``
    i.i.d. ``N_Z(0, sigma^2)^dim`` summed, shifted by an integer vector of L2 norm ``l2`` and L1
    norm ``l1``, ``D_alpha <= min(alpha l2^2 / (2 n sigma^2) + tau dim, alpha/2 (l2^2 /
    (n sigma^2) + 2 l1 tau / (sqrt(n) sigma) + tau^2 dim), alpha/2 (l2 / (sqrt(n) sigma) +
    tau sqrt(dim))^2)`` with ``tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1))``."""
    tau = 10.0 * math.fsum(math.exp(-2.0 * math.pi ** 2 * sigma ** 2 * k / (k + 1))
                           for k in range(1, int(n)))
    rn = math.sqrt(n) * sigma
    return min(alpha * l2 ** 2 / (2.0 * n * sigma ** 2) + tau * dim,
               alpha / 2.0 * (l2 ** 2 / (n * sigma ** 2) + 2.0 * l1 * tau / rn + tau ** 2 * dim),
               alpha / 2.0 * (l2 / rn + tau * math.sqrt(dim)) ** 2)


def _summation_depth(jaxpr) -> int:
    """Roundings a term of ``jaxpr``'s summations can go through: ``m - 1`` per ``reduce_sum``
    over ``m`` terms (any order of adding ``m`` numbers), 1 per binary ``add``, the
    contraction size minus 1 per ``dot_general``; nested jaxprs (``jit``) included. All of them
    are counted as if nested (an upper bound)."""
    depth = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "reduce_sum":
            shape = eqn.invars[0].aval.shape
            depth += int(np.prod([shape[a] for a in eqn.params["axes"]], dtype=np.int64)) - 1
        elif name in ("add", "add_any"):
            depth += 1
        elif name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            shape = eqn.invars[0].aval.shape
            depth += int(np.prod([shape[a] for a in contract], dtype=np.int64)) - 1
        elif name in ("cumsum", "reduce_precision", "reduce_max", "reduce_min", "scan", "while"):
            raise NotImplementedError(f"no rounding model for {name} in a sum of squares")
        for v in eqn.params.values():
            inner = getattr(v, "jaxpr", None)
            if inner is not None:
                depth += _summation_depth(getattr(inner, "jaxpr", inner))
    return depth


def float32_norm_error_bound(sum_of_squares: Callable, dim: int) -> float:
    """A rigorous bound ``e'`` with ``||x|| <= sqrt(computed) (1 + e')`` for any ``x`` ``[dim]``
    of integers (< 2^24, exact in float32), where ``computed = sum_of_squares(x)`` in float32:
    ``k = 1`` rounding per square plus the summations ``sum_of_squares`` traces
    (``_summation_depth``), so ``computed = ||x||^2 (1 + t)`` with ``|t| <= gamma_k = k u / (1 -
    k u)`` (Higham 2002, Lemma 3.1 and §4.2; non-negative terms), and the square root adds one
    more rounding: ``sqrt(computed) = ||x|| (1 + e)``, ``|e| <= max(sqrt(1 + gamma_k) (1 + u) - 1,
    1 - sqrt(1 - gamma_k) (1 - u))``; hence ``e' = e / (1 - e)`` (u = 2^-24)."""
    u = 2.0 ** -24
    jaxpr = jax.make_jaxpr(sum_of_squares)(jax.ShapeDtypeStruct((int(dim),), jnp.float32))
    k = 1 + _summation_depth(jaxpr.jaxpr)
    gamma = k * u / (1 - k * u)
    e = max(math.sqrt(1 + gamma) * (1 + u) - 1, 1 - math.sqrt(1 - gamma) * (1 - u))
    return e / (1 - e)


# ----------------------------------------------------------------------------- Geometric composition
def geometric_composition_epsilon(epsilon0: float, sensitivity: int, k: int, delta: float) -> float:
    """The exact (tight) epsilon at ``delta`` of ``k`` releases of the two-sided Geometric
    mechanism (``fedpriv.dp.geometric``: ``P(z) ~ exp(-t |z|)``, ``t = epsilon0 / sensitivity``)
    on an integer query of L1 sensitivity ``sensitivity`` (worst-case pair: a shift by
    ``sensitivity``). The privacy loss of one release at output ``x`` is ``t (|x - Delta| - |x|)``,
    a multiple of ``t`` in ``[-Delta t, Delta t]``: its distribution is exact on that grid
    (``x < 0`` and ``x > Delta`` summed in closed form), the k-fold composition is its k-fold
    convolution, and ``delta(eps) = E[(1 - exp(eps - L))_+]`` is inverted by bisection. For
    ``k`` pure ``epsilon0``-DP releases this is at most ``k epsilon0`` (basic composition) and
    equal to it as ``delta -> 0``."""
    D, t = int(sensitivity), float(epsilon0) / int(sensitivity)
    a = math.exp(-t)
    c = (1 - a) / (1 + a)                                   # P(z) = c a^|z|
    # loss index j: L = j t, j in [-D, D] step 2 (|x - D| - |x| for x in 0..D is D - 2x)
    pmf = np.zeros(2 * D + 1)                               # index j + D
    pmf[2 * D] += c / (1 - a)                               # x <= 0: L = D t (sum_{x<=0} c a^-x)
    pmf[0] += c * a ** (D + 1) / (1 - a)                    # x >= D + 1: L = -D t
    for x in range(1, D + 1):
        pmf[D - 2 * x + D] += c * a ** x                    # 0 < x <= D: L = (D - 2x) t
    total = np.array([1.0])
    for _ in range(int(k)):
        total = np.convolve(total, pmf)
    losses = (np.arange(len(total)) - k * D) * t

    def delta_of(eps):
        return float(np.sum(total * np.maximum(0.0, 1.0 - np.exp(eps - losses))))

    lo, hi = 0.0, k * float(epsilon0)
    if delta_of(lo) <= delta:
        return 0.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if delta_of(mid) <= delta else (mid, hi)
    return hi
