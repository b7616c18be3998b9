"""DP mechanisms as objects: what one private aggregation of a federated round is.

A mechanism binds (docs/design.md §1, principle 10; jax_privacy's privatizers and
``DPExecutionPlan``, pfl-research's mechanism objects):

* its **sensitivity**: every client's update is clipped to L2 norm ``clip_norm`` = C (the
  cohort sum's L2 sensitivity under add/remove; the engine divides the sum by C, so the noise is
  added to a sum of sensitivity 1, and multiplies back);
* its **privatizer** (``privatizer(z, key)``): an ``optax.GradientTransformation`` with its PRNG
  key in its state that noises that unit-sensitivity sum ``[params-shaped pytree]`` at noise
  multiplier z (the engine passes ``z s``, ``s = expected_cohort / noise_cohort_size``);
* its **release** per round for the accounting (``release_event(sampler, rounds, z, fresh)``):
  the ``dp_accounting`` event of ``rounds`` rounds under the sampler, built by the existing
  accounting code (``accounting.RoundRelease`` handed to ``sampler.amplified_event`` for fresh
  and tree noise, ``matrix_events.matrix_privacy_event`` for matrix noise, ``ddg.ddg_event``
  for distributed noise); ``privacy_event(sampler, rounds, simulated)`` is the whole event of a
  run (non-private cases, the noise-cohort scaling, the adaptive clip count);
* its **neighbouring relations** (``neighboring``: those its accounting holds under);
* optional client-side **encode** / server-side **decode** (``codec(cohort_size)``), for noise
  the clients add themselves under secure aggregation (DDG).

The five built-in mechanisms, each a frozen dataclass and registered under its name:

* ``GaussianMechanism`` ("gaussian"): DP-FedAvg, McMahan et al. 2018 (ICLR, "Learning
  differentially private recurrent language models", Alg. 1): ``sum + N(0, (z C)^2 I)`` with
  fresh noise every round;
* ``TreeMechanism`` ("tree"): DP-FTRL, Kairouz et al. 2021 (ICML, "Practical and private (deep)
  learning without sampling or shuffling", Alg. 1 / App. D): the increments of noisy prefix sums
  of a binary tree restarted every ``restart_every`` rounds (``fedpriv.dp.noise``);
* ``BandedMechanism`` ("banded"): banded matrix-factorization DP-FTRL, Choquette-Choo et al.
  2023 ("Multi-epoch matrix factorization", "(Amplified) banded MF"): the increments ``C^{-1} Z``
  of a ``bands``-banded Toeplitz ``C`` (``fedpriv.dp.matrix``);
* ``BLTMechanism`` ("blt"): buffered-linear-Toeplitz MF, Dvijotham et al. 2024 ("Efficient and
  near-optimal noise generation for streaming DP"), ``C^{-1} Z`` with ``blt_buffers`` buffers;
* ``DDGMechanism`` ("ddg"): the distributed discrete Gaussian under secure aggregation,
  Kairouz, Liu & Steinke 2021 (ICML, Alg. 1-2, Thm. 1 / Prop. 14; ``fedpriv.dp.ddg``).

``DPConfig``, ``MatrixDPConfig`` and ``DDGDPConfig`` remain the constructors (and the field sets
the run fingerprints record): ``DPConfig(C, z, "tree", R)`` *is* a ``TreeMechanism`` (the
registered class of that name). A new mechanism is one file: subclass ``DPConfig`` (frozen
dataclass, default ``mechanism`` = its name), implement ``privatizer`` and ``release_event``,
and (optionally) ``register_mechanism(name, cls)`` so configs can name it; ``build_algorithm``
and ``train`` accept the object as it is. Check it with ``fedpriv.dp.testing.check_mechanism``
(docs/extending.md, "A mechanism").
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, ClassVar

import dp_accounting as dpa
import jax
import jax.numpy as jnp
import optax

from fedpriv.dp import accounting, ddg, matrix
from fedpriv.dp.adaptive import AdaptiveClipping
from fedpriv.dp.clipping import WEIGHTINGS
from fedpriv.dp.matrix_events import matrix_privacy_event
from fedpriv.dp.noise import tree_privatizer
from fedpriv.registry import MECHANISMS, UnknownMechanism  # noqa: F401 (re-exported)


def register_mechanism(name: str, factory: type) -> type:
    """Register ``factory`` — a ``DPConfig`` subclass (frozen dataclass) whose ``mechanism``
    field defaults to ``name`` — under ``name`` in ``fedpriv.registry.MECHANISMS``, so
    ``DPConfig(..., mechanism=name)`` and configs naming it build it; returns ``factory``.
    Re-registering a name to another class is refused, so a name always means one mechanism."""
    if not (isinstance(factory, type) and issubclass(factory, DPConfig)) or \
            factory.__dataclass_fields__["mechanism"].default != name:
        raise ValueError(f"mechanism {name!r}: register a DPConfig subclass whose mechanism field "
                         f"defaults to {name!r}, got {factory!r}")
    return MECHANISMS.register(name, factory)


def get_mechanism(name: str) -> type:
    """The mechanism class registered under ``name`` (a plugin name ``"module:name"`` imports
    its module first); ``UnknownMechanism`` (a ``ConfigError``) naming it and the registered
    names otherwise."""
    return MECHANISMS.get(name)


def mechanism_names() -> tuple[str, ...]:
    """The registered mechanism names, in registration order (built-ins first)."""
    return MECHANISMS.names()


def _one(events: list) -> dpa.DpEvent | None:
    return None if not events else events[0] if len(events) == 1 else dpa.ComposedDpEvent(events)


@dataclasses.dataclass(frozen=True)
class DPConfig:
    """A DP aggregation (the base of every mechanism; the constructor of "gaussian" and "tree").

    ``DPConfig(...)`` returns the mechanism registered under ``mechanism`` (a subclass with
    ``DPConfig``'s fields and behaviour), e.g. ``DPConfig(1.0, 1.1, "tree", 100)`` is a
    ``TreeMechanism``; an unknown name raises ``UnknownMechanism``.

    Attributes:
      clip_norm: C (initial C if ``adaptive``); ``inf`` = no clipping (only with z = 0).
      noise_multiplier: z = noise std on the sum / C (per tree node for "tree").
      mechanism: the registered name ("gaussian" = DP-FedAvg, "tree" = DP-FTRL, ...).
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

    # the field set a run fingerprint records as the type (stable across this refactoring)
    config_type: ClassVar[str] = "DPConfig"
    # the neighbouring relations the mechanism's accounting holds under
    neighboring: ClassVar[tuple[str, ...]] = accounting.NEIGHBORING

    def __new__(cls, *args, **kwargs):
        name = kwargs["mechanism"] if "mechanism" in kwargs else (
            args[2] if len(args) > 2 else cls.__dataclass_fields__["mechanism"].default)
        if cls not in _CONSTRUCTORS and cls.__dataclass_fields__["mechanism"].default == name:
            return object.__new__(cls)  # a mechanism class itself (registered or not)
        target = get_mechanism(name)
        if target.config_type != cls.config_type:
            raise ValueError(f"mechanism {name!r} needs a {target.config_type}")
        obj = object.__new__(target)
        if not isinstance(obj, cls):  # Python runs __init__ only on instances of cls
            obj.__init__(*args, **kwargs)
        return obj

    def __post_init__(self):
        own = type(self).__dataclass_fields__["mechanism"].default
        if type(self) not in _CONSTRUCTORS and self.mechanism != own:
            raise ValueError(f"{type(self).__name__} is mechanism {own!r}, got {self.mechanism!r}")
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

    @property
    def is_private(self) -> bool:
        return self.noise_multiplier > 0 and (math.isfinite(self.clip_norm) or self.adaptive is not None)

    @property
    def sensitivity(self) -> float:
        """L2 norm bound of one client's contribution to the sum (add/remove): the clip norm C
        (the initial C with adaptive clipping; the engine noises the sum divided by C_t)."""
        return float(self.clip_norm)

    # ------------------------------------------------------------------ the mechanism protocol
    def privatizer(self, noise_multiplier: float, key=None) -> optax.GradientTransformation:
        """The noise on the cohort sum divided by C (a pytree shaped like the parameters, L2
        sensitivity 1) at multiplier ``noise_multiplier`` (the engine passes z s): an optax
        transformation whose state holds ``key`` (``key=None``: update-only, for a state that
        already exists)."""
        raise NotImplementedError(f"{type(self).__name__} has no privatizer")

    def release_event(self, sampler, rounds: int, noise_multiplier: float,
                      fresh: dpa.DpEvent | None = None) -> dpa.DpEvent:
        """The ``dp_accounting`` event of ``rounds`` rounds of this mechanism's release at
        ``noise_multiplier`` under ``sampler``, composed with ``fresh`` (another per-round
        release on the same cohort, e.g. the adaptive clip count; one subsampled mechanism)."""
        raise NotImplementedError(f"{type(self).__name__} has no release_event")

    @classmethod
    def run_fields(cls, sampler, rounds: int, options: dict) -> dict:
        """The fields this mechanism takes from a run (``fedpriv.recipes.lm``): its ``sampler``,
        ``rounds`` and the config's ``options`` (``mf_bands``, ``ddg_bits``, ``num_params``)."""
        return {}

    def codec(self, cohort_size: float):
        """Client-side encode / server-side decode (``SecureCodec``) if the clients add the noise
        under secure aggregation, else None (the server noises the sum with ``privatizer``)."""
        return None

    def privacy_event(self, sampler, rounds: int, simulated: bool = True) -> dpa.DpEvent:
        """The event of ``rounds`` rounds (``fedpriv.fl.algorithms.privacy_event``): the sampler
        must know its amplification (``amplified_event``) and declare a neighbouring relation
        the mechanism's accounting holds under (``neighboring``), if it declares one;
        ``NonPrivateDpEvent`` if not private (or with an exact adaptive clip count); z is scaled
        to the executed run's ``z s`` when ``noise_cohort_size`` is set and not ``simulated``;
        the adaptive clip count's Gaussian (``2 sigma_b``) rides along as ``fresh``."""
        amplify = getattr(sampler, "amplified_event", None)
        if not callable(amplify):
            raise ValueError(f"no privacy accounting for sampler {type(sampler).__name__}: it has no "
                             "amplified_event(release, rounds)")
        rel = getattr(sampler, "neighboring", None)
        if rel is not None and rel not in self.neighboring:
            raise ValueError(f"{self.mechanism} is accounted under {self.neighboring}, but "
                             f"{type(sampler).__name__}'s neighbours are {rel!r}")
        if not self.is_private:
            return dpa.NonPrivateDpEvent()
        z = float(self.noise_multiplier)
        if self.noise_cohort_size is not None and not simulated:
            z = z * sampler.expected_cohort_size / self.noise_cohort_size
        fresh = None
        if self.adaptive is not None:
            if not self.adaptive.count_stddev > 0:
                return dpa.NonPrivateDpEvent()  # the exact clip count is released
            fresh = dpa.GaussianDpEvent(float(self.adaptive.count_noise_multiplier))
        return self.release_event(sampler, rounds, z, fresh)


@dataclasses.dataclass(frozen=True)
class GaussianMechanism(DPConfig):
    """DP-FedAvg's Gaussian mechanism (McMahan et al. 2018, Alg. 1): the normalised sum plus
    ``N(0, z^2 I)``, fresh every round (``noise.gaussian_privatizer``: the tree at
    ``restart_every=1``); per round ``GaussianDpEvent(z)`` amplified by the sampler."""
    mechanism: str = "gaussian"

    def privatizer(self, noise_multiplier, key=None):
        return tree_privatizer(noise_multiplier, key, 1)

    def release_event(self, sampler, rounds, noise_multiplier, fresh=None):
        events = [dpa.GaussianDpEvent(noise_multiplier)] + ([fresh] if fresh is not None else [])
        release = accounting.RoundRelease(fresh=_one(events))
        return sampler.amplified_event(release, rounds)


@dataclasses.dataclass(frozen=True)
class TreeMechanism(DPConfig):
    """DP-FTRL's tree aggregation (Kairouz et al. 2021, Alg. 1): the increments of noisy
    prefix sums, node std z, one tree per ``restart_every`` rounds (``noise.tree_privatizer``);
    accounted by the sampler as one ``SingleEpochTreeAggregationDpEvent`` per tree
    (``accounting.RoundRelease`` with ``tree_noise_multiplier``)."""
    mechanism: str = "tree"

    @classmethod
    def run_fields(cls, sampler, rounds, options):
        return {"restart_every": sampler.rounds_per_epoch}  # one tree per epoch

    def privatizer(self, noise_multiplier, key=None):
        return tree_privatizer(noise_multiplier, key, self.restart_every)

    def release_event(self, sampler, rounds, noise_multiplier, fresh=None):
        release = accounting.RoundRelease(fresh=fresh, tree_noise_multiplier=noise_multiplier,
                                          restart_every=self.restart_every)
        return sampler.amplified_event(release, rounds)


@dataclasses.dataclass(frozen=True)
class MatrixDPConfig(DPConfig):
    """``DPConfig`` of matrix-factorization DP-FTRL (``fedpriv.dp.matrix``; a subclass, so the
    fingerprints of plain ``DPConfig`` runs are unchanged); the constructor of "banded"
    (``BandedMechanism``) and "blt" (``BLTMechanism``).

    Attributes (besides ``DPConfig``'s; z = std of Z in ``C x + Z`` over the clip norm):
      mechanism: "banded" (``bands`` bands, BSR) or "blt" (``blt_buffers`` buffers fitted for
        ``mf_rounds`` rounds, or ``blt_params = (theta, omega)``, e.g. from
        ``matrix.optimize_blt``).
      min_separation: the accounting assumes users participate at least this many rounds
        apart (>= bands for "banded"); the sampler must guarantee it
        (``fedpriv.fl.samplers``), else ``privacy_event`` raises.
    """
    mechanism: str = "banded"
    bands: int = 0
    min_separation: int = 0
    blt_buffers: int = 4
    mf_rounds: int = 0
    blt_params: tuple | None = None

    config_type: ClassVar[str] = "MatrixDPConfig"

    def __post_init__(self):
        super().__post_init__()
        if self.blt_params is not None:  # hashable, JSON-able: (theta tuple, omega tuple)
            object.__setattr__(self, "blt_params", tuple(tuple(map(float, v)) for v in self.blt_params))
        need = max(1, self.bands) if self.banded else 1
        if self.min_separation < need:
            raise ValueError(f"{self.mechanism} needs min_separation >= {need}, got "
                             f"{self.min_separation}")
        self.strategy  # validates the strategy's parameters

    # a banded C: run_fields plans ``bands``, the exact sensitivity needs min_separation >=
    # bands, and AmplifiedCyclicSampler's amplification holds (Choquette-Choo et al. 2023,
    # Thm. 4). False by default (fails closed: no amplification claimed); banded subclasses set it
    banded: ClassVar[bool] = False

    @property
    def strategy(self):
        """The ``matrix.BandedStrategy`` / ``BLTStrategy`` (the factor ``C``)."""
        return matrix.strategy_for(self.mechanism, self.bands, self.blt_buffers, self.mf_rounds,
                                   self.blt_params)

    @classmethod
    def run_fields(cls, sampler, rounds, options):
        """The strategy for the sampler's min-separation and ``rounds`` (banded: at most
        ``options["mf_bands"]`` bands, and no more than the min-separation)."""
        sep = sampler.min_separation
        return {"min_separation": sep, "mf_rounds": rounds,
                "bands": min(sep, options["mf_bands"]) if cls.banded else 0}

    def privatizer(self, noise_multiplier, key=None):
        return matrix.privatizer(self.strategy, noise_multiplier, key)

    def release_event(self, sampler, rounds, noise_multiplier, fresh=None):
        """``matrix_events.matrix_privacy_event``: a Gaussian at ``z / sens`` under the
        sampler's guaranteed min-separation (``MinSeparationError`` without one)."""
        return matrix_privacy_event(self, sampler, rounds, noise_multiplier, fresh)


@dataclasses.dataclass(frozen=True)
class BandedMechanism(MatrixDPConfig):
    """Banded MF (Choquette-Choo et al. 2023, "(Amplified) banded matrix factorization", §3-4):
    a ``bands``-banded Toeplitz ``C`` (``matrix.banded_privatizer``), sensitivity at
    ``min_separation``; amplified under ``AmplifiedCyclicSampler`` (Thm. 4)."""
    mechanism: str = "banded"
    banded: ClassVar[bool] = True


@dataclasses.dataclass(frozen=True)
class BLTMechanism(MatrixDPConfig):
    """BLT MF (Dvijotham et al. 2024; Choquette-Choo et al. 2024): a buffered-linear-Toeplitz
    ``C`` with ``blt_buffers`` buffers (``matrix.blt_privatizer``), no amplification claimed."""
    mechanism: str = "blt"


@dataclasses.dataclass(frozen=True)
class SecureCodec:
    """Client-side encode and server-side decode of one round under secure aggregation.

    ``begin(key, round_idx, dim) -> ctx`` (per round, in the jitted round); ``encode(ctx, vec
    [dim], slot, real) -> (message pytree, stats)`` per client (its weighted clipped update,
    ``slot`` its lane index, ``real`` > 0 iff a real client); the engine sums messages and stats;
    ``decode(ctx, summed, stats) -> (noised sum [dim], stats, released bool)``.
    """
    begin: Callable
    encode: Callable
    decode: Callable


@dataclasses.dataclass(frozen=True)
class DDGDPConfig(DPConfig):
    """``DPConfig`` of the distributed discrete Gaussian under simulated secure aggregation
    (Kairouz et al. 2021; ``fedpriv.dp.ddg``): every sampled client clips its update to C,
    rotates, scales, rounds and adds its own discrete Gaussian share; the server only sees the
    sum of the messages modulo ``2^bits`` and decodes it. z = std of the (planned) sum's noise
    over C, as elsewhere. The constructor of ``DDGMechanism``.

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

    config_type: ClassVar[str] = "DDGDPConfig"
    neighboring: ClassVar[tuple[str, ...]] = ("replace_one",)

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

    @classmethod
    def run_fields(cls, sampler, rounds, options):
        if not options.get("num_params"):
            raise ValueError("dp_ddg needs the model's number of parameters (num_params)")
        return {"dim": int(options["num_params"]), "bits": options["ddg_bits"]}

    def privatizer(self, noise_multiplier, key=None):
        return tree_privatizer(0.0, key, 1)  # holds the round key; the clients add the noise

    def privacy_event(self, sampler, rounds: int, simulated: bool = True) -> dpa.DpEvent:
        """One ``DistributedDiscreteGaussianDpEvent`` per participation (no amplification by
        sampling, Kairouz et al. 2021), for a fixed-size cohort sampler only (replace-one: both
        neighbours' rounds have the same number of shares); ``max_participations`` where the
        sampler bounds them, else every round."""
        if getattr(sampler, "neighboring", None) not in self.neighboring or \
                not isinstance(getattr(sampler, "cohort_size", None), int):
            raise ValueError(f"ddg accounting needs a fixed-size cohort sampler (replace-one), got "
                             f"{type(sampler).__name__}: removing a client would also remove its "
                             "noise share")
        maxp = getattr(sampler, "max_participations", None)
        k = int(maxp(rounds)) if callable(maxp) else rounds
        return dpa.SelfComposedDpEvent(self.event(sampler.cohort_size, simulated), k)

    def codec(self, cohort_size: float) -> SecureCodec:
        """Kairouz et al. 2021, Alg. 1-2 over a cohort of ``cohort_size`` (fixed): per round,
        keys ``split(fold_in(key, round), 3)`` (signs, dropout, client encodings folded with
        the slot); a client's message is its encoding mod ``2^bits`` (zero if it dropped out);
        the server decodes the modular sum and releases it iff enough messages arrived."""
        m = int(round(cohort_size))
        if m != cohort_size:
            raise ValueError(f"ddg needs a fixed cohort size, got expected {cohort_size}")
        if self.min_survivors > m:
            raise ValueError(f"min_survivors {self.min_survivors} > cohort size {m}")
        secure = self.secure_sum(m)  # the executed round (noise of z s)

        def begin(key, round_idx, dim):
            if dim != self.dim:
                raise ValueError(f"ddg was accounted for dim={self.dim} but the model has {dim} "
                                 "parameters")
            k = jax.random.split(jax.random.fold_in(key, round_idx), 3)
            return k, ddg.round_signs(secure, k[0])

        def encode(ctx, vec, slot, real):
            k, signs = ctx
            alive = (jax.random.uniform(jax.random.fold_in(k[1], slot)) >= self.dropout_rate) & (real > 0)
            raw, ok = ddg.encode(secure, vec, jax.random.fold_in(k[2], slot), signs)
            raw = jnp.where(alive, raw, 0)
            return (ddg.message(secure, raw), raw), {
                "ddg_survivors": alive.astype(jnp.float32),
                "ddg_rounding_failures": (alive & ~ok).astype(jnp.float32)}

        def decode(ctx, summed, stats):
            (msgs, raw), (k, signs) = summed, ctx  # noqa: F841 (ctx = encode's key and signs)
            released = stats["ddg_survivors"] >= (self.min_survivors or secure.num_clients)
            stats["ddg_overflow_coords"] = jnp.sum(ddg.centred(secure, msgs) != raw).astype(jnp.float32)
            stats["ddg_released"] = released.astype(jnp.float32)
            return ddg.decode(secure, msgs, signs), stats, released

        return SecureCodec(begin, encode, decode)


@dataclasses.dataclass(frozen=True)
class DDGMechanism(DDGDPConfig):
    """The distributed discrete Gaussian (Kairouz et al. 2021); see ``DDGDPConfig``."""
    mechanism: str = "ddg"


Mechanism = DPConfig  # the base every mechanism subclasses (a frozen dataclass)
_CONSTRUCTORS = (DPConfig, MatrixDPConfig, DDGDPConfig)
for _cls in (GaussianMechanism, TreeMechanism, BandedMechanism, BLTMechanism, DDGMechanism):
    register_mechanism(_cls.__dataclass_fields__["mechanism"].default, _cls)
BUILTIN_MECHANISMS = ("gaussian", "tree", "banded", "blt", "ddg")
