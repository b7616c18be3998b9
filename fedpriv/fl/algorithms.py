"""Private federated algorithms as ``(init, apply)`` builders over a ``ServerState`` pytree.

One round (McMahan et al. 2018 DP-FedAvg; Kairouz et al. 2021 DP-FTRL):

1. every sampled client runs local SGD from the server model (``client.make_local_step``, run over packed lanes of real steps);
2. its delta is clipped to C_t (``dp.clipping``), weighted by w_i in [0, 1] and masked;
3. the cohort sum (L2 sensitivity C_t) is divided by C_t, so its sensitivity is 1, and
   noised by the mechanism: fresh Gaussian noise (DP-FedAvg) or the tree increment
   (DP-FTRL), std ``z * s`` per coordinate, ``s = expected_cohort / noise_cohort_size`` (1
   unless simulating a larger noise cohort, McMahan et al. 2018 §4);
4. the result is multiplied back by C_t and divided by the *public* expected cohort size
   (the fixed-denominator estimator): the noisy average ``Delta_t``;
5. the server optimizer (optax) takes ``-Delta_t`` as its gradient: FedAvg = SGD (lr 1),
   FedAvgM = SGD with momentum, FedAdam = Adam (Reddi et al. 2021). With SGD, DP-FTRL's
   prefix-sum release gives exactly FTRL ``theta_t = theta_0 + eta * S_t``;
6. with adaptive clipping (Andrew et al. 2021) C_{t+1} is updated from a noised count.

Normalising by C_t before noising makes the noise valid even when C_t changes (adaptive
clipping with tree aggregation): every tree node sees unit-sensitivity leaves, and rescaling
by the (DP-released) C_t is post-processing. With fixed C it equals adding ``N(0, (z C)^2)``.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import optax
from flax import struct

from jax.flatten_util import ravel_pytree

from fedpriv.dp import accounting, ddg, matrix
from fedpriv.dp.adaptive import AdaptiveClipping, ClipState
from fedpriv.dp.noise import NoiseState, tree_privatizer
from fedpriv.fl.aggregate import WEIGHTINGS, packed_sum
from fedpriv.fl.client import make_local_step
from fedpriv.fl.cohort import Lanes, pack_padded
from fedpriv.fl.participation import matrix_privacy_event

MECHANISMS = ("gaussian", "tree", "banded", "blt", "ddg")
MATRIX_MECHANISMS = ("banded", "blt")  # matrix-factorization DP-FTRL (fedpriv.dp.matrix)


@dataclasses.dataclass(frozen=True)
class DPConfig:
    """Privacy configuration of an FL algorithm.

    Attributes:
      clip_norm: C (initial C if ``adaptive``); ``inf`` = no clipping (only with z = 0).
      noise_multiplier: z = noise std on the sum / C (per tree node for "tree").
      mechanism: "gaussian" (DP-FedAvg) or "tree" (DP-FTRL).
      restart_every: leaves per tree for "tree" (the sampler's rounds per epoch).
      noise_cohort_size: if set, the noise is that of a cohort of this size (z s C with
        s = expected_cohort / noise_cohort_size) — a simulation of a larger cohort; results
        must say so.
      weighting: "uniform" or "num_examples" (w_i = min(n_i, weight_cap) / weight_cap).
      adaptive: quantile-based adaptive clipping, or None for a fixed C.

    "banded" and "blt" (matrix-factorization DP-FTRL) take a ``MatrixDPConfig``; "ddg" (the
    distributed discrete Gaussian under secure aggregation) a ``DDGDPConfig``.
    """
    clip_norm: float = math.inf
    noise_multiplier: float = 0.0
    mechanism: str = "gaussian"
    restart_every: int = 1
    noise_cohort_size: int | None = None
    weighting: str = "uniform"
    weight_cap: float = 256.0
    adaptive: AdaptiveClipping | None = None

    def __post_init__(self):
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {MECHANISMS}, got {self.mechanism!r}")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
        accounting.check_noise_multiplier(self.noise_multiplier)
        if not self.clip_norm > 0:
            raise ValueError(f"clip_norm must be > 0, got {self.clip_norm}")
        if self.noise_multiplier > 0 and not math.isfinite(self.clip_norm) and self.adaptive is None:
            raise ValueError("noise needs a finite clip norm: the sensitivity is unbounded")
        if self.noise_cohort_size is not None and self.noise_cohort_size < 1:
            raise ValueError(f"noise_cohort_size must be >= 1, got {self.noise_cohort_size}")
        if self.weight_cap <= 0:
            raise ValueError("weight_cap must be > 0")
        need = {**{m: MatrixDPConfig for m in MATRIX_MECHANISMS}, "ddg": DDGDPConfig}.get(self.mechanism)
        if (not isinstance(self, need) if need is not None
                else isinstance(self, (MatrixDPConfig, DDGDPConfig))):
            name = need.__name__ if need is not None else "DPConfig"
            raise ValueError(f"mechanism {self.mechanism!r} needs a {name}")

    @property
    def is_private(self) -> bool:
        return self.noise_multiplier > 0 and (math.isfinite(self.clip_norm) or self.adaptive is not None)


@dataclasses.dataclass(frozen=True)
class MatrixDPConfig(DPConfig):
    """``DPConfig`` of matrix-factorization DP-FTRL (``fedpriv.dp.matrix``; a subclass, so the
    fingerprints of plain ``DPConfig`` runs are unchanged).

    Attributes (besides ``DPConfig``'s; z = std of Z in ``C x + Z`` over the clip norm):
      mechanism: "banded" (``bands`` bands, BSR) or "blt" (``blt_buffers`` buffers fitted for
        ``mf_rounds`` rounds, or ``blt_params = (theta, omega)``, e.g. from
        ``matrix.optimize_blt``).
      min_separation: the accounting assumes users participate at least this many rounds
        apart (>= bands for "banded"); the sampler must guarantee it
        (``fedpriv.fl.participation``), else ``privacy_event`` raises.
    """
    mechanism: str = "banded"
    bands: int = 0
    min_separation: int = 0
    blt_buffers: int = 4
    mf_rounds: int = 0
    blt_params: tuple | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.blt_params is not None:  # hashable, JSON-able: (theta tuple, omega tuple)
            object.__setattr__(self, "blt_params", tuple(tuple(map(float, v)) for v in self.blt_params))
        need = max(1, self.bands) if self.mechanism == "banded" else 1
        if self.min_separation < need:
            raise ValueError(f"{self.mechanism} needs min_separation >= {need}, got "
                             f"{self.min_separation}")
        matrix.strategy_for(self.mechanism, self.bands, self.blt_buffers, self.mf_rounds,
                            self.blt_params)


@dataclasses.dataclass(frozen=True)
class DDGDPConfig(DPConfig):
    """``DPConfig`` of the distributed discrete Gaussian under simulated secure aggregation
    (Kairouz et al. 2021; ``fedpriv.dp.ddg``): every sampled client clips its update to C,
    rotates, scales, rounds and adds its own discrete Gaussian share; the server only sees the
    sum of the messages modulo ``2^bits`` and decodes it. z = std of the (planned) sum's noise
    over C, as elsewhere.

    Attributes (besides ``DPConfig``'s):
      dim: the model's number of parameters (the accounting depends on it; checked against the
        parameters when the round is traced).
      bits: secure aggregation's modulus ``2^bits`` (<= 31).
      dropout_rate: each sampled client's message is lost with this probability (its share
        too); the shares are sized for ``floor(m (1 - dropout_rate))`` survivors.
      min_survivors: the server releases a round's sum only if at least this many messages
        arrived, else aborts it (no update); 0 = the whole cohort. The event accounts for the
        worst count in ``[min_survivors, m]``.

    Needs a fixed-size cohort sampler (replace-one neighbours: ``privacy_event`` refuses
    others), a fixed clip norm, and no noise-cohort simulation with dropout.
    """
    mechanism: str = "ddg"
    dim: int = 0
    bits: int = 16
    dropout_rate: float = 0.0
    min_survivors: int = 0

    def __post_init__(self):
        super().__post_init__()
        if self.dim < 1:
            raise ValueError(f"ddg needs dim (the model's parameter count) >= 1, got {self.dim}")
        if self.adaptive is not None or not math.isfinite(self.clip_norm):
            raise ValueError("ddg needs a fixed, finite clip norm (no adaptive clipping)")
        if not 0 <= self.dropout_rate < 1 or self.min_survivors < 0:
            raise ValueError(f"ddg needs 0 <= dropout_rate < 1 and min_survivors >= 0, got "
                             f"{self.dropout_rate}, {self.min_survivors}")
        if self.noise_cohort_size is not None and (self.dropout_rate or self.min_survivors):
            raise ValueError("ddg: a simulated noise cohort cannot be combined with dropout")
        ddg.DDGConfig(self.dim, 2, 1.0, 1.0, self.bits)  # bits in range

    def secure_sum(self, cohort_size: int, simulated: bool = False) -> ddg.DDGConfig:
        """The ``ddg.DDGConfig`` of one round with ``cohort_size`` clients: executed (z s) or,
        with ``noise_cohort_size`` and ``simulated``, the simulated cohort's (z)."""
        m = int(cohort_size)
        z = float(self.noise_multiplier)
        if self.noise_cohort_size is not None:
            if simulated:
                m = int(self.noise_cohort_size)
            else:
                z = z * m / self.noise_cohort_size
        return ddg.DDGConfig(self.dim, m, float(self.clip_norm), z, self.bits, self.dropout_rate)

    def event(self, cohort_size: int, simulated: bool = False) -> dpa.DpEvent:
        """One round's ``DistributedDiscreteGaussianDpEvent`` (replace-one)."""
        cfg = self.secure_sum(cohort_size, simulated)
        low = cfg.num_clients if simulated and self.noise_cohort_size else (self.min_survivors or cfg.num_clients)
        return ddg.ddg_event(cfg, low, "replace_one")


@struct.dataclass
class ServerState:
    params: object
    opt_state: object
    noise_state: NoiseState
    clip_state: ClipState
    round: jax.Array  # int32


@dataclasses.dataclass(frozen=True)
class FederatedAlgorithm:
    """A (DP-)federated algorithm; both ``apply`` functions are jit-compiled.

    * ``init(params, key) -> ServerState``;
    * ``apply_packed(state, lanes, client_mask, key, first=None) -> (state, metrics)``: one
      round on a cohort packed into lanes (``fedpriv.fl.cohort.pack_cohort``: only real steps
      run; ``first``: the clients' first steps batched with shared weights) — what the round
      loop uses;
    * ``apply(state, batches, client_mask, key) -> (state, metrics)``: the same round on a
      padded cohort (``build_cohort``: ``batches`` of ``[K, S, B, ...]``), one lane per client.
    """
    init: Callable
    apply: Callable
    dp: DPConfig
    expected_cohort_size: float
    apply_packed: Callable = None
    local_epochs: int = 1


def build_algorithm(loss_fn: Callable, client_optimizer: optax.GradientTransformation,
                    server_optimizer: optax.GradientTransformation, dp: DPConfig,
                    expected_cohort_size: float, local_epochs: int = 1,
                    chunk_size: int | None = None, jit: bool = True,
                    compute_dtype=None) -> FederatedAlgorithm:
    """Build a (DP-)federated algorithm. See the module docstring for the round.

    ``chunk_size``: vmap at most this many lanes (clients of a padded cohort) at once.
    ``compute_dtype``: e.g. ``jnp.bfloat16`` for mixed-precision client forward/backward passes
    (``client.make_local_step``); clipping, sums and noise are always float32.
    """
    if expected_cohort_size <= 0:
        raise ValueError("expected_cohort_size must be > 0")
    if local_epochs < 1:
        raise ValueError(f"local_epochs must be >= 1, got {local_epochs}")
    local_step = make_local_step(loss_fn, client_optimizer, compute_dtype)
    scale = 1.0 if dp.noise_cohort_size is None else expected_cohort_size / dp.noise_cohort_size
    restart = dp.restart_every if dp.mechanism == "tree" else 1
    # the noise on the normalised sum (sensitivity 1): fedpriv.dp's optax privatizer itself
    privatizer = lambda key=None: tree_privatizer(dp.noise_multiplier * scale, key, restart)  # noqa: E731
    if dp.mechanism in MATRIX_MECHANISMS:
        strategy = matrix.strategy_for(dp.mechanism, dp.bands, dp.blt_buffers, dp.mf_rounds,
                                       dp.blt_params)
        privatizer = lambda key=None: matrix.privatizer(strategy, dp.noise_multiplier * scale, key)  # noqa: E731
    secure = None
    if dp.mechanism == "ddg":
        m = int(round(expected_cohort_size))
        if m != expected_cohort_size:
            raise ValueError(f"ddg needs a fixed cohort size, got expected {expected_cohort_size}")
        if dp.min_survivors > m:
            raise ValueError(f"min_survivors {dp.min_survivors} > cohort size {m}")
        secure = dp.secure_sum(m)  # the executed round (noise of z s)
        privatizer = lambda key=None: tree_privatizer(0.0, key, 1)  # noqa: E731 (holds the key)
    noise = privatizer()  # update-only: the key lives in ServerState.noise_state
    adaptive = dp.adaptive
    normalise = math.isfinite(dp.clip_norm) or adaptive is not None

    def init(params, key) -> ServerState:
        k_noise, k_clip = jax.random.split(key)
        clip0 = adaptive.initial_clip if adaptive is not None else dp.clip_norm
        clip_state = ClipState(jnp.asarray(clip0, jnp.float32), k_clip)
        return ServerState(params, server_optimizer.init(params), privatizer(k_noise).init(params),
                           clip_state, jnp.zeros((), jnp.int32))

    def secure_round(state: ServerState, lanes: Lanes, client_mask, key, first):
        """DDG: sum the clients' messages mod 2^bits and decode (``fedpriv.dp.ddg``)."""
        flat, unravel = ravel_pytree(state.params)
        if flat.size != dp.dim:
            raise ValueError(f"ddg was accounted for dim={dp.dim} but the model has {flat.size} "
                             "parameters")
        k = jax.random.split(jax.random.fold_in(state.noise_state.key, state.round), 3)
        signs = ddg.round_signs(secure, k[0])

        def encode(contrib, slot, real):
            alive = (jax.random.uniform(jax.random.fold_in(k[1], slot)) >= dp.dropout_rate) & (real > 0)
            raw, ok = ddg.encode(secure, ravel_pytree(contrib)[0], jax.random.fold_in(k[2], slot), signs)
            raw = jnp.where(alive, raw, 0)
            return (ddg.message(secure, raw), raw), {
                "ddg_survivors": alive.astype(jnp.float32),
                "ddg_rounding_failures": (alive & ~ok).astype(jnp.float32)}

        (msgs, raw), stats = packed_sum(local_step, client_optimizer.init, state.params, lanes,
                                        client_mask.shape[0], key, dp.clip_norm, dp.weighting,
                                        dp.weight_cap, chunk_size, first, encode=encode)
        noisy = unravel(ddg.decode(secure, msgs, signs).astype(flat.dtype))
        released = stats["ddg_survivors"] >= (dp.min_survivors or secure.num_clients)
        stats["ddg_overflow_coords"] = jnp.sum(ddg.centred(secure, msgs) != raw).astype(jnp.float32)
        stats["ddg_released"] = released.astype(jnp.float32)
        return noisy, stats, released

    def apply_packed(state: ServerState, lanes: Lanes, client_mask, key, first=None):
        clip = state.clip_state.clip_norm
        if secure is not None:
            noised, stats, released = secure_round(state, lanes, client_mask, key, first)
            return finish_round(state, noised, stats, client_mask, state.noise_state, released)
        total, stats = packed_sum(local_step, client_optimizer.init, state.params, lanes,
                                  client_mask.shape[0], key, clip, dp.weighting, dp.weight_cap,
                                  chunk_size, first)
        total = jax.tree_util.tree_map(lambda t, p: t.astype(p.dtype), total, state.params)
        if normalise:
            unit = jax.tree_util.tree_map(lambda x: x / clip, total)
            noised, noise_state = noise.update(unit, state.noise_state)
            noised = jax.tree_util.tree_map(lambda x: x * clip, noised)
        else:
            noised, noise_state = total, state.noise_state
        return finish_round(state, noised, stats, client_mask, noise_state)

    def finish_round(state, noised, stats, client_mask, noise_state, released=None):
        clip = state.clip_state.clip_norm
        avg = jax.tree_util.tree_map(lambda x: x / expected_cohort_size, noised)
        grad = jax.tree_util.tree_map(jnp.negative, avg)
        updates, opt_state = server_optimizer.update(grad, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if released is not None:  # an aborted round changes nothing
            keep = lambda new, old: jax.tree_util.tree_map(  # noqa: E731
                lambda a, b: jnp.where(released, a, b), new, old)
            params, opt_state = keep(params, state.params), keep(opt_state, state.opt_state)
        clip_state, frac = state.clip_state, jnp.nan
        if adaptive is not None:
            clip_state, frac = adaptive.update(state.clip_state, stats["norms"], client_mask,
                                               expected_cohort_size, state.round)
        n = jnp.maximum(stats["num_clients"], 1.0)
        metrics = dict(stats["aux"])
        metrics.update(num_clients=stats["num_clients"], clip_norm=clip,
                       mean_update_norm=stats["norm_sum"] / n,
                       frac_clipped=stats["num_clipped"] / n, num_nonfinite=stats["num_nonfinite"],
                       unclipped_estimate=frac)
        metrics.update({k: v for k, v in stats.items() if k.startswith("ddg_")})
        return ServerState(params, opt_state, noise_state, clip_state, state.round + 1), metrics

    def apply(state: ServerState, batches, client_mask, key):
        return apply_packed(state, pack_padded(batches, client_mask, local_epochs), client_mask, key)

    if jit:
        apply = jax.jit(apply)
        apply_packed = jax.jit(apply_packed)
    return FederatedAlgorithm(init, apply, dp, float(expected_cohort_size), apply_packed, local_epochs)


# ----------------------------------------------------------------------------- builders
def server_optimizer(name: str, learning_rate: float, momentum: float = 0.9,
                     b1: float = 0.9, b2: float = 0.99, eps: float = 1e-3) -> optax.GradientTransformation:
    """FedAvg ("sgd"), FedAvgM ("sgdm"), FedAdam ("adam", Reddi et al. 2021 defaults: eps=1e-3)."""
    if name == "sgd":
        return optax.sgd(learning_rate)
    if name == "sgdm":
        return optax.sgd(learning_rate, momentum=momentum)
    if name == "adam":
        return optax.adam(learning_rate, b1=b1, b2=b2, eps=eps)
    raise ValueError(f"server optimizer must be sgd, sgdm or adam, got {name!r}")


def dp_fedavg(loss_fn, client_optimizer, server_opt, *, clip_norm, noise_multiplier,
              expected_cohort_size, **kw) -> FederatedAlgorithm:
    """DP-FedAvg (McMahan et al. 2018): Gaussian noise, fresh every round."""
    dp_kw = {k: kw.pop(k) for k in ("noise_cohort_size", "weighting", "weight_cap", "adaptive") if k in kw}
    dp = DPConfig(clip_norm, noise_multiplier, "gaussian", **dp_kw)
    return build_algorithm(loss_fn, client_optimizer, server_opt, dp, expected_cohort_size, **kw)


def dp_ftrl(loss_fn, client_optimizer, server_opt, *, clip_norm, noise_multiplier,
            expected_cohort_size, rounds_per_epoch, **kw) -> FederatedAlgorithm:
    """DP-FTRL (Kairouz et al. 2021): tree-aggregation noise restarted every epoch."""
    dp_kw = {k: kw.pop(k) for k in ("noise_cohort_size", "weighting", "weight_cap", "adaptive") if k in kw}
    dp = DPConfig(clip_norm, noise_multiplier, "tree", rounds_per_epoch, **dp_kw)
    return build_algorithm(loss_fn, client_optimizer, server_opt, dp, expected_cohort_size, **kw)


# ----------------------------------------------------------------------------- privacy
def privacy_event(dp: DPConfig, sampler, rounds: int, simulated: bool = True) -> dpa.DpEvent:
    """The ``dp_accounting`` event of ``rounds`` rounds of an algorithm with ``dp``.

    Args:
      dp: the algorithm's DP configuration.
      sampler: the client sampler used (its kind decides the amplification).
      rounds: rounds to account for.
      simulated: with ``noise_cohort_size`` set, True accounts for the simulated run (noise
        cohort of ``noise_cohort_size`` drawn from a population scaled up by the same factor
        as the cohort — the McMahan et al. 2018 convention; say so in results); False
        accounts for the run actually executed (multiplier ``z * s``).

    The event is derived from what runs: the round's release (``accounting.RoundRelease``: the
    noisy sum at multiplier z — fresh Gaussian noise, or DP-FTRL's tree — and, with adaptive
    clipping, the noisy clip count at ``2 sigma_b``, both computed on the same cohort) is
    handed to the sampler, which knows its own amplification (``sampler.amplified_event``):
    Poisson -> ``PoissonSampled(q, Composed([G(z), G(2 sigma_b)]))`` per round, one subsampled
    mechanism; fixed-size -> its without-replacement analogue (replace-one); shuffled passes ->
    one tree and one count per epoch. A sampler without ``amplified_event`` is refused.
    Matrix mechanisms ("banded", "blt"): ``participation.matrix_privacy_event`` — a Gaussian
    at ``z / sens`` under the sampler's guaranteed min-separation, or ``MinSeparationError``.

    Returns a ``NonPrivateDpEvent`` for a non-private configuration, including adaptive
    clipping with a noise-free count (the ledger refuses it).
    """
    rounds = accounting.check_rounds(rounds)
    if dp.mechanism == "ddg":
        return _ddg_privacy_event(dp, sampler, rounds, simulated)
    amplify = getattr(sampler, "amplified_event", None)
    if not callable(amplify):
        raise ValueError(f"no privacy accounting for sampler {type(sampler).__name__}: it has no "
                         "amplified_event(release, rounds)")
    if not dp.is_private:
        return dpa.NonPrivateDpEvent()
    z = float(dp.noise_multiplier)
    if dp.noise_cohort_size is not None and not simulated:
        z = z * sampler.expected_cohort_size / dp.noise_cohort_size
    fresh = [] if dp.mechanism in ("tree", *MATRIX_MECHANISMS) else [dpa.GaussianDpEvent(z)]
    if dp.adaptive is not None:
        if not dp.adaptive.count_stddev > 0:
            return dpa.NonPrivateDpEvent()  # the exact clip count is released
        fresh.append(dpa.GaussianDpEvent(float(dp.adaptive.count_noise_multiplier)))
    if dp.mechanism in MATRIX_MECHANISMS:  # refuses a sampler without the min-separation
        return matrix_privacy_event(dp, sampler, rounds, z, None if not fresh else
                                    fresh[0] if len(fresh) == 1 else dpa.ComposedDpEvent(fresh))
    release = accounting.RoundRelease(
        fresh=None if not fresh else fresh[0] if len(fresh) == 1 else dpa.ComposedDpEvent(fresh),
        tree_noise_multiplier=z if dp.mechanism == "tree" else None,
        restart_every=dp.restart_every if dp.mechanism == "tree" else None)
    return amplify(release, rounds)


def _ddg_privacy_event(dp, sampler, rounds: int, simulated: bool) -> dpa.DpEvent:
    """DDG: one ``DistributedDiscreteGaussianDpEvent`` per participation (no amplification by
    sampling, Kairouz et al. 2021), for a fixed-size cohort sampler only (replace-one: both
    neighbours' rounds have the same number of shares); ``max_participations`` where the
    sampler bounds them, else every round."""
    if getattr(sampler, "neighboring", None) != "replace_one" or \
            not isinstance(getattr(sampler, "cohort_size", None), int):
        raise ValueError(f"ddg accounting needs a fixed-size cohort sampler (replace-one), got "
                         f"{type(sampler).__name__}: removing a client would also remove its "
                         "noise share")
    maxp = getattr(sampler, "max_participations", None)
    k = int(maxp(rounds)) if callable(maxp) else rounds
    return dpa.SelfComposedDpEvent(dp.event(sampler.cohort_size, simulated), k)


def neighboring_for(sampler) -> str:
    """The neighbouring relation the sampler's accounting uses (``sampler.neighboring``);
    a sampler that does not declare one is refused."""
    rel = getattr(sampler, "neighboring", None)
    if rel not in accounting.NEIGHBORING:
        raise ValueError(f"no neighbouring relation for sampler {type(sampler).__name__}: it "
                         f"declares {rel!r}, expected one of {accounting.NEIGHBORING}")
    return rel
