"""fedpriv.dp: the privacy layer — clipping, noise mechanisms (optax-native privatizers),
adaptive clipping, discrete (Geometric) noise, accounting with dp-accounting, and the one
privacy ledger a pipeline spends its budget through.

Composes with optax::

    from fedpriv import dp
    tx = optax.chain(dp.tree_privatizer(z * C, key, restart_every=R), optax.scale(-1 / m),
                     optax.sgd(lr))       # DP-FTRL's noise on a sum of clipped updates

Matrix-factorization DP-FTRL (``dp.banded_privatizer`` / ``dp.blt_privatizer``, ``dp.matrix``)
and the distributed discrete Gaussian under simulated secure aggregation (``dp.ddg``) sit
beside them. ``fedpriv.fl`` builds its rounds from these objects; ``docs/privacy.md`` lists every release
and how it is accounted.
"""
from fedpriv.dp.accounting import (
                                   MAX_ROUNDS,
                                   NEIGHBORING,
                                   CalibrationError,
                                   RoundRelease,
                                   calibrate_noise_multiplier,
                                   canonical_event,
                                   check_delta,
                                   check_epsilon,
                                   compute_epsilon,
                                   dp_fedavg_poisson_event,
                                   dp_fedavg_wor_event,
                                   dp_ftrl_event,
                                   epoch_lengths,
                                   poisson_sampled_event,
                                   pure_epsilon,
                                   replace_one_event,
                                   wor_sampled_event,
)
from fedpriv.dp.adaptive import AdaptiveClipping, ClipState
from fedpriv.dp.clipping import ClipNormError, check_clip_norm, clip_update, global_norm
from fedpriv.dp.ddg import (
                                   DDGConfig,
                                   DDGRound,
                                   DistributedDiscreteGaussianDpEvent,
                                   ddg_epsilon,
                                   ddg_event,
                                   ddg_rdp,
                                   ddg_round,
)
from fedpriv.dp.geometric import geometric_dp_event, geometric_epsilon, geometric_mechanism, geometric_noise
from fedpriv.dp.keys import numpy_generator, tagged_key
from fedpriv.dp.ledger import LedgerEntry, PrivacyBudgetExceeded, PrivacyLedger, event_from_json, event_to_json
from fedpriv.dp.matrix import (
                                   BandedStrategy,
                                   BLTStrategy,
                                   MinSeparationError,
                                   banded_privatizer,
                                   banded_strategy,
                                   blt_privatizer,
                                   blt_strategy,
                                   gram_sensitivity,
                                   matrix_event,
                                   optimize_blt,
                                   variance_ratio_to_tree,
)
from fedpriv.dp.mechanisms import (
                                   BandedMechanism,
                                   BLTMechanism,
                                   DDGMechanism,
                                   GaussianMechanism,
                                   Mechanism,
                                   TreeMechanism,
                                   UnknownMechanism,
                                   get_mechanism,
                                   mechanism_names,
                                   register_mechanism,
)
from fedpriv.dp.noise import (
                                   NoiseState,
                                   gaussian_privatizer,
                                   noise_like,
                                   release_key,
                                   streaming_privatizer,
                                   tree_privatizer,
)

__all__ = [
    "MAX_ROUNDS", "NEIGHBORING", "CalibrationError", "RoundRelease", "calibrate_noise_multiplier",
    "canonical_event", "check_delta", "check_epsilon", "compute_epsilon", "dp_fedavg_poisson_event",
    "dp_fedavg_wor_event", "dp_ftrl_event", "epoch_lengths", "poisson_sampled_event",
    "pure_epsilon", "replace_one_event", "wor_sampled_event",
    "AdaptiveClipping", "ClipState", "ClipNormError", "check_clip_norm", "clip_update",
    "global_norm", "geometric_dp_event", "geometric_epsilon", "geometric_mechanism",
    "geometric_noise", "numpy_generator", "tagged_key", "LedgerEntry", "PrivacyBudgetExceeded",
    "PrivacyLedger", "event_from_json", "event_to_json", "NoiseState",
    "gaussian_privatizer", "noise_like", "release_key", "streaming_privatizer",
    "tree_privatizer", "BandedStrategy", "BLTStrategy", "MinSeparationError",
    "banded_privatizer", "banded_strategy", "blt_privatizer", "blt_strategy", "gram_sensitivity",
    "matrix_event", "optimize_blt", "variance_ratio_to_tree", "DDGConfig", "DDGRound",
    "ddg_epsilon", "ddg_rdp", "ddg_round", "DistributedDiscreteGaussianDpEvent", "ddg_event",
    "Mechanism", "GaussianMechanism", "TreeMechanism", "BandedMechanism", "BLTMechanism",
    "DDGMechanism", "UnknownMechanism", "get_mechanism", "mechanism_names", "register_mechanism",
]
