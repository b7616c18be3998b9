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
  (``fedpriv.fred.pipeline``);
* ``rdp_epsilon`` / ``pld_epsilon``: raw ``dp_accounting`` accountants on a list of events (the
  ledger's and the plans' accountant choice, ``fedpriv.dp.accounting.compute_epsilon``);
* ``gaussian_epsilon``: the exact epsilon of one Gaussian mechanism (Balle & Wang 2018, Thm. 8),
  by bisection on its closed-form delta;
* ``per_pass_event``: a shuffled-pass run written out one pass at a time (the declared
  population's event, ``fedpriv.dp.population``; the shuffled samplers' ``periodic_event``);
* ``executed_noise_cohort_event``: the event of a run that trains ``m`` clients per round at
  the noise of ``M`` (``noise_cohort_size``, ``fedpriv.dp.mechanisms``);
* ``observed_min_separation``: the smallest gap between two rounds of one client, read off a
  sampler's cohorts (``fedpriv.fl.samplers``' declared ``min_separation``).
"""
from __future__ import annotations

import hashlib
from typing import Any, Callable, Iterable, Mapping

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import numpy as np
import optax
from scipy import optimize, special

from fedpriv.dp.clipping import clip_update
from fedpriv.dp.ddg import DDGConfig, DDGRound
from fedpriv.dp.noise import node_noise, noise_like
from fedpriv.fl.aggregate import client_weight
from fedpriv.fred.pipeline import fred_release_event
from fedpriv.models.llama import Teacher, _forward_jit
from fedpriv.recipes import lm as lm_recipe


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
