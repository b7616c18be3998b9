"""Private federated algorithms as ``(init, apply)`` builders over a ``ServerState`` pytree.

One round (McMahan et al. 2018 DP-FedAvg; Kairouz et al. 2021 DP-FTRL):

1. every sampled client runs its hooks (``client.ClientHooks``: init from the server's
   broadcast -- and, for a client that keeps state across rounds, from its own state, which
   stays on it --, local steps, final release; default local SGD from the server model,
   ``client.default_client``, releasing its model delta), over packed lanes of real steps;
2. its release is clipped to C_t as one vector (``dp.clipping``), weighted by w_i in [0, 1] and
   masked;
3. the cohort sum (L2 sensitivity C_t) is divided by C_t, so its sensitivity is 1, and
   noised by the mechanism's privatizer (``fedpriv.dp.mechanisms``: fresh Gaussian noise for
   DP-FedAvg, the tree increment for DP-FTRL, ``C^{-1} Z`` for banded / BLT MF), at multiplier
   ``z * s``, ``s = expected_cohort / noise_cohort_size`` (1 unless simulating a larger noise
   cohort, McMahan et al. 2018 §4) — or, for DDG, encoded and noised by the clients and
   decoded from the secure sum by the server (the mechanism's ``codec``);
4. the result is multiplied back by C_t and divided by the *public* expected cohort size
   (the fixed-denominator estimator): the noisy average ``Delta_t``;
5. the server's hooks (``client.ServerHooks``) post-process ``Delta_t``: by default
   (``client.optimizer_server``) the server optimizer (optax) takes ``-Delta_t`` as its
   gradient: FedAvg = SGD (lr 1), FedAvgM = SGD with momentum, FedAdam = Adam, FedYogi = Yogi
   (Reddi et al. 2021). With SGD, DP-FTRL's prefix-sum release gives exactly FTRL
   ``theta_t = theta_0 + eta * S_t``. Any server hook sees only the DP release and public
   server state: post-processing, no privacy cost;
6. with adaptive clipping (Andrew et al. 2021) C_{t+1} is updated from a noised count.

Normalising by C_t before noising makes the noise valid even when C_t changes (adaptive
clipping with tree aggregation): every tree node sees unit-sensitivity leaves, and rescaling
by the (DP-released) C_t is post-processing. With fixed C it equals adding ``N(0, (z C)^2)``.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.flatten_util import ravel_pytree

from fedpriv.dp import accounting
from fedpriv.dp.adaptive import ClipState
from fedpriv.dp.mechanisms import (  # noqa: F401
    BUILTIN_MECHANISMS,
    DDGDPConfig,
    DPConfig,
    MatrixDPConfig,  # (re-exported: the mechanisms' constructors)
)
from fedpriv.dp.noise import NoiseState
from fedpriv.fl.aggregate import packed_sum
from fedpriv.fl.client import ClientHooks, ServerHooks, ServerView, default_client, optimizer_server
from fedpriv.fl.cohort import Lanes, pack_padded
from fedpriv.registry import OPTIMIZERS

# the built-in mechanisms' names (the registry, fedpriv.dp.mechanisms, may hold more)
MECHANISMS = BUILTIN_MECHANISMS


@struct.dataclass
class ServerState:
    """The server's state between rounds: ``params``, ``opt_state`` (the server hooks' state:
    the server optimizer's by default; broadcast to the clients), ``noise_state`` (the
    mechanism's, with its PRNG key: secret), ``clip_state`` and ``round``. Client state never
    lives here (it stays on the clients: ``client.ClientHooks.state_init``)."""
    params: object
    opt_state: object
    noise_state: NoiseState
    clip_state: ClipState
    round: jax.Array  # int32


def _server_view(state: ServerState) -> ServerView:
    """What the clients of a round are sent: model, server optimizer state, round (no noise
    state: its keys are secret)."""
    return ServerView(state.params, state.opt_state, state.round)


@dataclasses.dataclass(frozen=True)
class FederatedAlgorithm:
    """A (DP-)federated algorithm; ``apply`` is jit-compiled.

    * ``init(params, key) -> ServerState``;
    * ``apply(state, cohort, client_mask[K], key, first=None, client_states=None) -> (state,
      metrics)``: one round. ``cohort`` is either ``Lanes`` (packed by
      ``fedpriv.fl.cohort.pack_cohort``: only real steps run; ``first``: the clients' first
      steps batched with shared weights; what the round loop uses) or a padded cohort's
      ``batches`` (``build_cohort``: a dict of ``[K, S, B, ...]`` arrays, one lane per client).
      With client hooks that keep state (``client``'s ``stateful``), ``client_states`` (the
      cohort's states by slot, ``[K, ...]``) is required and the result is ``(state, metrics,
      client_states)``.
    * ``client``: the client hooks (``client_state_init(params)``: one client's initial state,
      or None for stateless clients); ``server``: the server hooks.
    """
    init: Callable
    apply: Callable
    dp: DPConfig
    expected_cohort_size: float
    local_epochs: int = 1
    client: ClientHooks | None = None
    server: ServerHooks | None = None

    @property
    def stateful_clients(self) -> bool:
        """Whether the clients keep state across rounds (``ClientHooks.state_init``)."""
        return self.client is not None and self.client.stateful


def _finish_round(server: ServerHooks, adaptive, expected_cohort_size, state, noised, stats,
                  client_mask, noise_state, released=None):
    """The server's half of a round: average the noised sum over the expected cohort, run the
    server hooks on it (post-processing of the release; undone if a secure round was aborted:
    ``released`` False), update an adaptive clip, and the round's metrics."""
    clip = state.clip_state.clip_norm
    avg = jax.tree_util.tree_map(lambda x: x / expected_cohort_size, noised)
    params, opt_state = server.update(state.params, state.opt_state, avg, state.round)
    if released is not None:  # an aborted round changes nothing
        keep = lambda new, old: jax.tree_util.tree_map(
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


def build_algorithm(loss_fn: Callable | None, client_optimizer: optax.GradientTransformation | None,
                    server_optimizer: optax.GradientTransformation | None, dp: DPConfig,
                    expected_cohort_size: float, local_epochs: int = 1,
                    chunk_size: int | None = None, jit: bool = True,
                    compute_dtype=None, client: ClientHooks | None = None,
                    server: ServerHooks | None = None) -> FederatedAlgorithm:
    """Build a (DP-)federated algorithm. See the module docstring for the round.

    ``dp``: the mechanism (``fedpriv.dp.mechanisms``: ``DPConfig(...)`` of a registered name, or
    any ``DPConfig`` subclass instance): the engine clips to ``dp.clip_norm``, noises the sum
    divided by C with ``dp.privatizer(z s, key)`` (its key in ``ServerState.noise_state``), or,
    if ``dp.codec(m)`` gives one, lets the clients encode and the server decode the secure sum.
    ``chunk_size``: vmap at most this many lanes (clients of a padded cohort) at once.
    ``compute_dtype``: e.g. ``jnp.bfloat16`` for mixed-precision client forward/backward passes
    (``client.make_local_step``); clipping, sums and noise are always float32.
    ``client``: ``ClientHooks`` (e.g. ``fedpriv.fl.fedprox``; default: local SGD of
    ``client_optimizer`` on ``loss_fn``, which are then not needed); their release is still
    clipped to C, so hooks never change the sensitivity or the privacy event.
    ``server``: ``ServerHooks`` run on the privatized release (post-processing; default:
    ``optimizer_server(server_optimizer)``, which is then not needed).
    """
    client, server = _hooks(loss_fn, client_optimizer, server_optimizer, expected_cohort_size,
                            local_epochs, compute_dtype, client, server)
    scale = 1.0 if dp.noise_cohort_size is None else expected_cohort_size / dp.noise_cohort_size
    # the noise on the normalised sum (sensitivity 1): the mechanism's optax privatizer
    privatizer = lambda key=None: dp.privatizer(dp.noise_multiplier * scale, key)
    codec = dp.codec(expected_cohort_size)  # client-side encode / server-side decode, or None
    noise = privatizer()  # update-only: the key lives in ServerState.noise_state
    adaptive = dp.adaptive
    normalise = math.isfinite(dp.clip_norm) or adaptive is not None
    release_like = functools.partial(_release_like, client)

    def init(params, key) -> ServerState:
        k_noise, k_clip = jax.random.split(key)
        clip0 = adaptive.initial_clip if adaptive is not None else dp.clip_norm
        clip_state = ClipState(jnp.asarray(clip0, jnp.float32), k_clip)
        opt_state, round0 = server.init(params), jnp.zeros((), jnp.int32)
        like = release_like(ServerView(params, opt_state, round0))
        return ServerState(params, opt_state, privatizer(k_noise).init(params if like is None else like),
                           clip_state, round0)

    def clients_sum(state, lanes, client_mask, key, first, client_states, clip, encode=None):
        out = packed_sum(client, None, _server_view(state), lanes, client_mask.shape[0], key, clip,
                         dp.weighting, dp.weight_cap, chunk_size, first, encode=encode,
                         client_states=client_states)
        return out if client.stateful else out + (None,)

    def apply(state: ServerState, cohort, client_mask, key, first=None, client_states=None):
        lanes = cohort if isinstance(cohort, Lanes) else pack_padded(cohort, client_mask, local_epochs)
        clip = state.clip_state.clip_norm
        if codec is not None:
            noised, stats, released, new_states = _secure_round(
                codec, functools.partial(clients_sum, state, lanes, client_mask, key, first,
                                         client_states, dp.clip_norm), release_like, state)
            out = finish_round(state, noised, stats, client_mask, state.noise_state, released)
            return out if new_states is None else out + (new_states,)
        total, stats, new_states = clients_sum(state, lanes, client_mask, key, first, client_states, clip)
        if release_like(_server_view(state)) is None:  # a params-shaped release
            total = jax.tree_util.tree_map(lambda t, p: t.astype(p.dtype), total, state.params)
        if normalise:
            unit = jax.tree_util.tree_map(lambda x: x / clip, total)
            noised, noise_state = noise.update(unit, state.noise_state)
            noised = jax.tree_util.tree_map(lambda x: x * clip, noised)
        else:
            noised, noise_state = total, state.noise_state
        out = finish_round(state, noised, stats, client_mask, noise_state)
        return out if new_states is None else out + (new_states,)

    finish_round = functools.partial(_finish_round, server, adaptive, expected_cohort_size)
    if jit:
        apply = jax.jit(apply)
    return FederatedAlgorithm(init, apply, dp, float(expected_cohort_size), local_epochs, client,
                              server)


def _hooks(loss_fn, client_optimizer, server_optimizer, expected_cohort_size, local_epochs,
           compute_dtype, client, server) -> tuple[ClientHooks, ServerHooks]:
    """``build_algorithm``'s checks, and its client and server hooks (the defaults: local SGD
    of ``client_optimizer`` on ``loss_fn``; ``optimizer_server(server_optimizer)``)."""
    if expected_cohort_size <= 0:
        raise ValueError("expected_cohort_size must be > 0")
    if local_epochs < 1:
        raise ValueError(f"local_epochs must be >= 1, got {local_epochs}")
    if client is None and (loss_fn is None or client_optimizer is None):
        raise ValueError("build_algorithm needs client hooks (client=...) or a loss_fn and a "
                         "client_optimizer for the default local SGD")
    if server is None and server_optimizer is None:
        raise ValueError("build_algorithm needs server hooks (server=...) or a server_optimizer")
    return (client or default_client(loss_fn, client_optimizer, compute_dtype),
            server or optimizer_server(server_optimizer))


def _secure_round(codec, clients_sum, release_like, state: ServerState):
    """The clients encode (and noise) their clipped releases, the secure sum is decoded:
    ``(noised sum, stats, released, new client states or None)``; ``clients_sum(encode)`` runs
    the cohort (``packed_sum`` with the round's arguments bound)."""
    like = release_like(_server_view(state))
    flat, unravel = ravel_pytree(state.params if like is None else like)
    ctx = codec.begin(state.noise_state.key, state.round, flat.size)

    def encode(contrib, slot, real):
        return codec.encode(ctx, ravel_pytree(contrib)[0], slot, real)

    summed, stats, new_states = clients_sum(encode)
    total, stats, released = codec.decode(ctx, summed, stats)
    return unravel(total.astype(flat.dtype)), stats, released, new_states


def _release_like(client: ClientHooks, view: ServerView):
    """The structure of the clients' release (``jax.eval_shape`` of the hooks' ``init`` and
    ``final`` at the server's broadcast, no data): None when it is the params' structure (the
    default: a model delta), else zeros of the release's shapes and dtypes."""
    def release():
        if client.stateful:
            carry = client.init(view, client.state_init(view.params))
            return client.final(view, carry)[0]
        return client.final(view, client.init(view))
    like = jax.eval_shape(release)
    if jax.tree_util.tree_structure(like) == jax.tree_util.tree_structure(view.params):
        return None
    return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), like)


# ----------------------------------------------------------------------------- builders
def server_optimizer(name: str, learning_rate: float, momentum: float = 0.9,
                     b1: float = 0.9, b2: float = 0.99, eps: float = 1e-3) -> optax.GradientTransformation:
    """The server optimizer registered as ``name`` (``fedpriv.registry.OPTIMIZERS``): FedAvg
    ("sgd"), FedAvgM ("sgdm"), FedAdam ("adam", Reddi et al. 2021 defaults: eps=1e-3), or a
    researcher's; an unknown name fails closed, listing the registered ones."""
    return OPTIMIZERS.get(name)(learning_rate, momentum=momentum, b1=b1, b2=b2, eps=eps)


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
    """The ``dp_accounting`` event of ``rounds`` rounds of an algorithm with ``dp``: the
    mechanism's own ``dp.privacy_event(sampler, rounds, simulated)`` (``fedpriv.dp.mechanisms``).

    Args:
      dp: the algorithm's mechanism (a ``DPConfig``: built-in or user-defined).
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
    Matrix mechanisms ("banded", "blt"): ``samplers.matrix_privacy_event`` — a Gaussian
    at ``z / sens`` under the sampler's guaranteed min-separation, or ``MinSeparationError``.
    DDG: one distributed discrete Gaussian event per participation (fixed-size cohorts only).

    Returns a ``NonPrivateDpEvent`` for a non-private configuration, including adaptive
    clipping with a noise-free count (the ledger refuses it).
    """
    return dp.privacy_event(sampler, accounting.check_rounds(rounds), simulated)


def neighboring_for(sampler) -> str:
    """The neighbouring relation the sampler's accounting uses (``sampler.neighboring``);
    a sampler that does not declare one is refused."""
    rel = getattr(sampler, "neighboring", None)
    if rel not in accounting.NEIGHBORING:
        raise ValueError(f"no neighbouring relation for sampler {type(sampler).__name__}: it "
                         f"declares {rel!r}, expected one of {accounting.NEIGHBORING}")
    return rel
