"""The privacy events of matrix-factorization DP-FTRL under participation-aware samplers.

``matrix_privacy_event(dp, sampler, rounds, z, fresh)`` is what a banded / BLT mechanism
(``fedpriv.dp.mechanisms.MatrixDPConfig.release_event``) charges: a Gaussian at ``z / sens``
under the min-separation the sampler *guarantees* (``sampler.min_separation``,
``sampler.max_participations``; Choquette-Choo et al. 2023, "Multi-epoch matrix
factorization"), or -- for a sampler that declares ``amplifies_banded_mf = True``
(``fedpriv.fl.samplers.AmplifiedCyclicSampler``: cyclic Poisson groups) and a banded ``C`` --
the amplified event of "(Amplified) banded MF", Thm. 4 (``amplified_banded_event``). The
samplers themselves live in ``fedpriv.fl.samplers`` (which re-exports these names); the
accounting is duck-typed on what a sampler declares, so ``fedpriv.dp`` never imports
``fedpriv.fl``.
"""
from __future__ import annotations

import dp_accounting as dpa

from fedpriv.dp import accounting
from fedpriv.dp.matrix import BandedStrategy, MinSeparationError, matrix_event
from fedpriv.errors import FedprivError


class AmplificationError(FedprivError, ValueError):
    """A mechanism the sampler's amplification theorem does not cover (fails closed)."""


def _amplifies(sampler) -> bool:
    """Whether ``sampler`` declares cyclic Poisson groups (``amplifies_banded_mf = True``)."""
    return getattr(type(sampler), "amplifies_banded_mf", False) is True


def amplified_banded_event(strategy, noise_multiplier: float, rounds: int, num_groups: int,
                           sampling_rate: float, fresh: dpa.DpEvent | None = None) -> dpa.DpEvent:
    """Choquette-Choo et al. 2023 ("(Amplified) banded MF", Thm. 4 with Alg. 2's cyclic Poisson
    sampling): ``rounds`` rounds of a ``BandedStrategy`` with ``bands <= num_groups`` are as
    private as ``ceil(rounds / num_groups)`` steps of DP-SGD at sampling probability
    ``sampling_rate`` and multiplier ``noise_multiplier / max_j ||C[:, j]||`` (the first
    column of the Toeplitz ``C``; add/remove). ``fresh`` (a per-round release beside the MF
    noise, e.g. the adaptive clip count) is refused: the theorem as stated covers the MF
    release alone (fail closed; use a fixed clip norm or ``CyclicSampler``)."""
    if fresh is not None:
        raise AmplificationError("amplified banded MF accounts for the MF release only "
                                 "(Choquette-Choo et al. 2023, Thm. 4): no adaptive clipping count "
                                 "beside it; use a fixed clip norm or CyclicSampler")
    if not isinstance(strategy, BandedStrategy):
        raise AmplificationError(f"amplified cyclic Poisson accounting holds for banded C only "
                                 f"(Choquette-Choo et al. 2023, Thm. 4), not {type(strategy).__name__}")
    rounds = accounting.check_rounds(rounds)
    if strategy.bands > num_groups:
        raise MinSeparationError(f"a {strategy.bands}-banded strategy needs >= {strategy.bands} "
                                 f"groups for amplification, got {num_groups}")
    col_norm = strategy.sensitivity(rounds, int(num_groups), 1)  # max column norm (column 0)
    inner = dpa.GaussianDpEvent(float(noise_multiplier) / col_norm)
    k = -(-rounds // int(num_groups))
    return accounting.poisson_sampled_event(inner, sampling_rate, k)


def matrix_privacy_event(dp, sampler, rounds: int, noise_multiplier: float,
                         fresh: dpa.DpEvent | None = None) -> dpa.DpEvent:
    """The event of ``rounds`` rounds of a banded/BLT ``dp`` (a ``DPConfig``) under ``sampler``.

    Fails closed: ``MinSeparationError`` unless the sampler guarantees a min-separation
    ``>= dp.min_separation`` (an attribute ``min_separation`` and ``max_participations``).
    With an ``AmplifiedCyclicSampler`` the event is the amplified one (``amplified_banded_event``:
    ``ceil(T / b)`` x ``PoissonSampled(q, Gaussian(z / max column norm))``) for a banded ``C``
    (``dp.banded``: "banded", "banded_opt"); ``AmplificationError`` otherwise, e.g. "blt" (the
    theorem needs a banded ``C``)."""
    rounds = accounting.check_rounds(rounds)
    sep = getattr(sampler, "min_separation", None)
    maxp = getattr(sampler, "max_participations", None)
    if not isinstance(sep, int) or not callable(maxp):
        raise MinSeparationError(f"{type(sampler).__name__} guarantees no min-separation: the "
                                 f"{dp.mechanism} strategy's accounting refuses it (use CyclicSampler)")
    if sep < dp.min_separation:
        raise MinSeparationError(f"the {dp.mechanism} strategy was built for min-separation "
                                 f"{dp.min_separation} but {type(sampler).__name__} only "
                                 f"guarantees {sep}")
    if _amplifies(sampler) and not dp.banded:
        raise AmplificationError(f"AmplifiedCyclicSampler's amplification holds for banded MF only "
                                 f"(Choquette-Choo et al. 2023, Thm. 4), not {dp.mechanism!r}: "
                                 f"use CyclicSampler")
    strategy = dp.strategy
    if _amplifies(sampler):
        return amplified_banded_event(strategy, noise_multiplier, rounds, sep,
                                      sampler.sampling_rate, fresh)
    k = int(maxp(rounds))
    event = matrix_event(strategy, noise_multiplier, rounds, dp.min_separation, k)
    if fresh is None:
        return event
    return dpa.ComposedDpEvent([event, dpa.SelfComposedDpEvent(fresh, k)])
