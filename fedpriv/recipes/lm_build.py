"""An LM-FL run's pieces from its config (Wang et al. 2023 §2, App. C): the model and task, the
algorithm (its registered :class:`~fedpriv.recipes.algorithms.LMAlgorithm`: mechanism, sampler,
client and server hooks, optimizers), the sampler, the privacy event and the noise multiplier
(calibrated to ``target_epsilon`` against a pipeline's earlier releases, or the paper-noise
protocol's), and the run's fingerprint.
"""
from __future__ import annotations

import dataclasses
import os

import dp_accounting as dpa
import jax

from fedpriv.dp import accounting, population
from fedpriv.dp.adaptive import AdaptiveClipping
from fedpriv.dp.mechanisms import get_mechanism
from fedpriv.errors import ConfigError
from fedpriv.fl import algorithms as algs
from fedpriv.models.lm import LMConfig, make_lm, make_lm_task
from fedpriv.recipes.algorithms import get_algorithm
from fedpriv.registry import OPTIMIZERS, SAMPLERS

__all__ = ["model_config", "build_task", "simulated_population", "adaptive_clipping", "paper_noise",
           "client_compute_dtype", "build_algorithm", "resolve", "SAME_NUMBERS_BATCHINGS",
           "run_fingerprint"]

def model_config(cfg, vocab_size: int) -> LMConfig:
    """The on-device LM of ``cfg``: its model fields (``configs.lm_fl.LMModelFields``: arch,
    embed_dim, hidden_dim, num_heads) and ``seq_len``, over ``vocab_size`` tokens."""
    return LMConfig(vocab_size=vocab_size, arch=cfg.arch, embed_dim=cfg.embed_dim,
                    hidden_dim=cfg.hidden_dim, num_heads=getattr(cfg, "num_heads", 10),
                    max_len=max(64, cfg.seq_len))


def build_task(cfg, vocab_size: int):
    """The LM task of :func:`model_config` (any config with the LM-FL fields, e.g.
    ``configs.lm_fl.LMFLConfig`` or ``configs.public_training.PublicTrainingConfig``)."""
    return make_lm_task(make_lm(model_config(cfg, vocab_size)))


def simulated_population(cfg):
    """The :class:`~fedpriv.dp.population.SimulatedPopulation` ``cfg`` declares (paper-noise
    protocol), checked against its algorithm and cohort; None without one or for FedAvg."""
    name = getattr(cfg, "simulated_population", None)
    if name is None or cfg.algorithm == "fedavg":
        return None
    pop = population.get_population(name)
    population.check_protocol(pop, algorithm=cfg.algorithm, cohort_size=cfg.cohort_size,
                              noise_cohort_size=cfg.noise_cohort_size)
    return pop


def adaptive_clipping(cfg):
    """The :class:`~fedpriv.dp.adaptive.AdaptiveClipping` of ``cfg`` (``adaptive_clip``; the
    initial C is ``clip_norm``, sigma_b defaults to ``cohort_size / 20`` as Andrew et al.
    suggest), or None for a fixed clip norm."""
    if not getattr(cfg, "adaptive_clip", False):
        return None
    std = cfg.clip_count_stddev if cfg.clip_count_stddev is not None else cfg.cohort_size / 20
    return AdaptiveClipping(initial_clip=cfg.clip_norm, target_quantile=cfg.clip_quantile,
                            learning_rate=cfg.clip_lr, count_stddev=float(std))


def paper_noise(cfg, z: float, alg, sampler, num_clients: int, rounds: int | None = None):
    """Both epsilons of ``cfg``'s run under the paper-noise protocol
    (:func:`fedpriv.dp.population.paper_noise`): the declared population's, and the one SPENT on
    our ``num_clients`` training users -- the event of the run executed, derived here from the
    algorithm and sampler that run (``simulated=False``: with ``noise_cohort_size`` the
    multiplier ``z * cohort / noise_cohort``, never the noise-cohort simulation's). ``rounds``:
    default ``cfg.rounds``. None without a simulated population."""
    pop = simulated_population(cfg)
    if pop is None or alg is None:
        return None
    rounds = cfg.rounds if rounds is None else rounds
    executed = algs.privacy_event(alg.dp, sampler, rounds, simulated=False)
    ours = cfg.corpus + (f" ({os.path.basename(str(cfg.corpus_path))})" if getattr(cfg, "corpus_path", None) else "")
    adaptive = getattr(alg.dp, "adaptive", None)
    return population.paper_noise(pop, z, rounds, executed, ours, num_clients, cfg.delta,
                                  algs.neighboring_for(sampler),
                                  count_noise=None if adaptive is None else adaptive.count_noise_multiplier)


def client_compute_dtype(cfg_or_name):
    """The client pass's ``compute_dtype`` (None: float32) of ``cfg.client_compute`` (or of the
    name itself, e.g. "bfloat16")."""
    name = cfg_or_name if isinstance(cfg_or_name, str) else getattr(cfg_or_name, "client_compute", "float32")
    return None if name == "float32" else jax.numpy.dtype(name)


def resolve(part, registry):
    """An algorithm's part: a registered name (``registry.get``) or the object itself."""
    return registry.get(part) if isinstance(part, str) else part


def build_algorithm(cfg, num_clients: int, loss_fn, prior_events=(), num_params: int | None = None,
                    *, client=None, server=None):
    """Algorithm, sampler, the run's privacy event(s) and its noise multiplier.

    The parts come from ``cfg.algorithm``'s registered ``LMAlgorithm`` (its mechanism, sampler,
    hooks and optimizers; the server optimizer is ``cfg.server_optimizer`` unless the algorithm
    names its own). ``client`` / ``server``: ``ClientHooks`` / ``ServerHooks`` that replace the
    algorithm's (a researcher's own, e.g. with their own model's loss). With
    ``target_epsilon``, z is calibrated so that ``prior_events`` (what a pipeline's ledger
    already spent on these users, e.g. FreD releases) composed with this run stay within it,
    under the sampler's neighbouring relation. ``num_params``: the model's size (``dp_ddg``'s
    accounting depends on it).
    """
    if cfg.cohort_size > num_clients:
        raise ValueError(f"cohort_size {cfg.cohort_size} > {num_clients} training clients")
    spec = get_algorithm(cfg.algorithm)
    sampler = resolve(spec.sampler, SAMPLERS)(num_clients, cfg.cohort_size, cfg.seed)
    client_opt = resolve(spec.client_optimizer, OPTIMIZERS)(cfg.client_lr)
    server_opt = resolve(spec.server_optimizer or cfg.server_optimizer, OPTIMIZERS)(
        cfg.server_lr, momentum=cfg.server_momentum)
    dtype = client_compute_dtype(cfg)
    if client is None and spec.client is not None:
        client = spec.client(loss_fn, client_opt, dtype, cfg)
    if server is None and spec.server is not None:
        server = spec.server(server_opt, cfg, num_clients)

    def build(dp):
        return algs.build_algorithm(loss_fn, client_opt, server_opt, dp, sampler.expected_cohort_size,
                                    compute_dtype=dtype, client=client, server=server)

    if spec.mechanism is None:  # no noise (FedAvg)
        return build(algs.DPConfig(clip_norm=cfg.clip_norm)), sampler, None, 0.0
    factory = spec.mechanism if isinstance(spec.mechanism, type) else _mechanism(cfg.algorithm, spec.mechanism)
    # the registered mechanism (fedpriv.dp.mechanisms), its run-dependent fields from the sampler
    options = {"mf_bands": getattr(cfg, "mf_bands", None), "ddg_bits": getattr(cfg, "ddg_bits", None),
               "num_params": num_params}  # (configs without MF or DDG lack the first two)
    fields = factory.run_fields(sampler, cfg.rounds, options)
    adaptive = adaptive_clipping(cfg)
    if adaptive is not None:
        fields = {**fields, "adaptive": adaptive}

    def dp_of(z):
        return factory(clip_norm=cfg.clip_norm, noise_multiplier=z,
                       noise_cohort_size=cfg.noise_cohort_size, **fields)

    z = _noise_multiplier(cfg, lambda z: algs.privacy_event(dp_of(z), sampler, cfg.rounds), sampler,
                          prior_events, adaptive)
    alg = build(dp_of(z))
    return alg, sampler, algs.privacy_event(alg.dp, sampler, cfg.rounds), z  # what the loop charges


def _mechanism(algorithm: str, name: str):
    try:
        return get_mechanism(name)
    except ConfigError as e:
        raise ConfigError(f"algorithm {algorithm!r}: {e}") from None


def _noise_multiplier(cfg, make, sampler, prior_events, adaptive=None) -> float:
    """z: ``cfg.noise_multiplier``, or calibrated to ``cfg.target_epsilon`` (the paper-noise
    protocol's simulated population's, or this run's composed with ``prior_events``).
    ``adaptive``: the run's adaptive clipping, whose count the population is charged too."""
    pop = simulated_population(cfg)
    if cfg.noise_multiplier is not None:
        return cfg.noise_multiplier
    if cfg.target_epsilon is not None and pop is not None:
        # the paper-noise protocol: target_epsilon is the SIMULATED population's epsilon (the
        # paper's z for the paper's epsilon); the run is charged what it spends on our users
        if list(prior_events):
            raise ConfigError("a simulated population's epsilon cannot be targeted after earlier "
                              "releases on the same users (set noise_multiplier, or no simulated_population)")
        # calibrated over the paper's rounds (or the run's, if longer): the paper's per-round
        # noise; a shorter run's simulated epsilon (reported) is then below the target. With
        # adaptive clipping the count is charged to the population too (z raised to pay for it)
        return pop.noise_multiplier(cfg.target_epsilon, cfg.delta, max(cfg.rounds, pop.rounds),
                                    count_noise=None if adaptive is None else adaptive.count_noise_multiplier)
    if cfg.target_epsilon is not None:
        prior = list(prior_events)
        total = (lambda z: dpa.ComposedDpEvent(prior + [make(z)])) if prior else make
        # with the accountant the run reports ("best": PLD where it applies and is tighter), so
        # every algorithm reaches the same reported epsilon
        return accounting.calibrate_noise_multiplier(total, cfg.target_epsilon, cfg.delta,
                                                     algs.neighboring_for(sampler), accountant="best")
    raise ValueError("a DP algorithm needs noise_multiplier or target_epsilon")


# local batchings that compute the same numbers up to float summation order
# (fedpriv.fl.cohort "Length-aware batches"): a run resumes / is read back across them (not
# bit-identically); "sorted" is another local SGD trajectory and identifies its runs
SAME_NUMBERS_BATCHINGS = ("padded", "trimmed", "packed", "auto")

# config fields that do not identify a run (the loop fingerprints rounds-independent privacy
# and data fields itself: DP config, sampler, seed, population)
_NOT_FINGERPRINTED = ("rounds", "eval_every", "eval_batch_size", "max_eval_examples",
                      "checkpoint_every", "lanes", "progress")


def run_fingerprint(cfg) -> dict:
    """The config fields a resumed run must match, beside the loop's own (rounds excluded)."""
    d = dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(vars(cfg))
    if d.get("arch") != "transformer":
        d.pop("num_heads", None)  # no effect on an LSTM (and runs from before the field resume)
    if d.get("algorithm") != "dp_ddg":
        d.pop("ddg_bits", None)  # likewise
    if d.get("batching") in SAME_NUMBERS_BATCHINGS:
        d.pop("batching")  # the same computation up to float order (and runs from before the field)
    if d.get("client_compute") == "float32":
        d.pop("client_compute")  # likewise
    if not d.get("adaptive_clip"):  # a fixed clip norm: the adaptive fields do nothing (and older runs resume)
        for k in ("adaptive_clip", "clip_quantile", "clip_lr", "clip_count_stddev"):
            d.pop(k, None)
    return {k: v for k, v in d.items() if k not in _NOT_FINGERPRINTED}
