"""Recipe: private FL of an on-device LM on a real user-keyed corpus (Wang et al. 2023 §2, §3, App. C).

Turns a config (``configs/lm_fl.py``'s fields) into data, task, algorithm, sampler and privacy
event, and runs them: data -> tokenizer -> model -> algorithm -> ledger -> the one round loop
(``fedpriv.fl.loop.train``) -> summary (JSON, Markdown, PNG learning curve). The building block
of the LM experiments (``make demo``, the privacy-utility table, the public-data and FreD
pipelines)::

    from fedpriv.recipes import lm
    summary = lm.run_lm_fl(cfg, "runs/lm_fl")      # or the pieces: prepare_data, build_task,
                                                   # build_algorithm

Privacy: the unit is the user (client). With ``noise_cohort_size`` the run trains with
``cohort_size`` clients per round but adds the noise of ``noise_cohort_size`` (McMahan et al.
2018): the reported epsilon is that of the simulated run whose cohort is ``noise_cohort_size``
drawn from a population scaled up by the same factor; the epsilon of the run actually
executed is reported next to it. With ``simulated_population`` (the paper-noise protocol,
:mod:`fedpriv.dp.population`) the run adds the paper's per-round noise on the paper's cohort and
its summary states both epsilons side by side (``paper_noise``): the paper's population's
(declared) and the one spent on our users (the ledger's charge, ``epsilon``).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

import dp_accounting as dpa
import jax
import numpy as np
import optax

from fedpriv import report
from fedpriv.data import (
    WordTokenizer,
    load_chitchat,
    load_public_pool,
    load_shakespeare,
    load_simpsons,
    paper_corpora,
    train_sentencepiece,
)
from fedpriv.data.errors import ConfigError
from fedpriv.data.tokenizers import UNK_ID, word_ids_to_token_accuracy
from fedpriv.dp import (
    accounting,
    optimized_banded,  # noqa: F401 (registers "banded_opt", a mechanism in its own file)
    population,
)
from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.dp.mechanisms import UnknownMechanism, get_mechanism
from fedpriv.fl import algorithms as algs
from fedpriv.fl.loop import train
from fedpriv.fl.samplers import CyclicSampler, PoissonSampler, ShuffledPassSampler, UniformSampler
from fedpriv.models.lm import LMConfig, count_params, make_lm, make_lm_task
from fedpriv.models.metrics import accuracy_with_oov, evaluate, most_frequent_token_accuracy, predict_next

# configs/lm_fl.py's algorithms: name -> (the mechanism's name in the registry of
# fedpriv.dp.mechanisms, None for no noise; the client sampler, a key of SAMPLERS)
ALGORITHM_SPECS = {
    "fedavg": (None, "shuffled"),
    "dp_fedavg": ("gaussian", "poisson"),            # DP-FedAvg, Poisson cohorts
    "dp_ftrl": ("tree", "shuffled"),                 # DP-FTRL, one tree per shuffled pass
    "dp_mf_banded": ("banded", "cyclic"),            # matrix-factorization DP-FTRL, cyclic cohorts
    "dp_mf_blt": ("blt", "cyclic"),
    "dp_fedavg_fixed": ("gaussian", "uniform"),      # central Gaussian, fixed-size cohorts (replace-one)
    "dp_ddg": ("ddg", "uniform"),                    # noise added by the clients (no amplification)
    "dp_mf_banded_opt": ("banded_opt", "cyclic"),    # banded MF, coefficients optimised (jax_privacy)
}
# name -> (num_clients, cfg) -> sampler
SAMPLERS = {
    "shuffled": lambda n, cfg: ShuffledPassSampler(n, cfg.cohort_size, seed=cfg.seed),
    "poisson": lambda n, cfg: PoissonSampler(n, cfg.cohort_size / n, seed=cfg.seed),
    "uniform": lambda n, cfg: UniformSampler(n, cfg.cohort_size, seed=cfg.seed),
    "cyclic": lambda n, cfg: CyclicSampler(n, cfg.cohort_size, seed=cfg.seed),
}

LOADERS = {"chitchat": load_chitchat, "shakespeare": load_shakespeare, "simpsons": load_simpsons}
# the papers' own data, read from ``cfg.corpus_path`` (fedpriv.data.paper_corpora)
PATH_LOADERS = paper_corpora.PATH_LOADERS


def load_corpus(cfg, progress: bool = True):
    """``cfg.corpus``: a packaged corpus (:data:`LOADERS`) or the papers' own file at
    ``cfg.corpus_path`` (:data:`PATH_LOADERS`: TFF StackOverflow SQLite, Reddit-style JSONL)."""
    if cfg.corpus in PATH_LOADERS:
        return paper_corpora.load_path_corpus(cfg.corpus, getattr(cfg, "corpus_path", None), progress=progress)
    if cfg.corpus not in LOADERS:
        raise ConfigError(f"unknown corpus {cfg.corpus!r}; choose one of {sorted(LOADERS) + sorted(PATH_LOADERS)}")
    if getattr(cfg, "corpus_path", None):
        raise ConfigError(f"corpus_path is set but corpus={cfg.corpus} is packaged (it reads no path)")
    return LOADERS[cfg.corpus](progress=progress)


def load_public(cfg, progress: bool = True):
    """The public pool: ``cfg.public_pool_path`` (a C4-like TFDS directory or text files,
    ``paper_corpora.load_public_text``) or the packaged pool."""
    path = getattr(cfg, "public_pool_path", None)
    return paper_corpora.load_public_text(path, progress=progress) if path else load_public_pool(progress=progress)


@dataclasses.dataclass
class Prepared:
    train: object          # FederatedDataset
    val: object
    test: object
    tokenizer: object
    stats: dict
    train_text: object = None  # FederatedText of the training users (their raw messages)
    test_text: object = None   # ... and of the test users


TOKENIZER_NAMES = ("sentencepiece", "word_public", "word")


def parse_tokenizer(spec: str) -> tuple[str, int | None]:
    """A tokenizer spec ``name[:vocab size]``: ``"word:5000"`` -> ``("word", 5000)``,
    ``"sentencepiece"`` -> ``("sentencepiece", None)`` (the config's ``vocab_size``).
    Raises :class:`ConfigError` for anything else."""
    name, sep, size = str(spec).partition(":")
    if name not in TOKENIZER_NAMES or (sep and not (size.isdigit() and int(size) > 4)):
        raise ConfigError(f"tokenizer {spec!r}: expected name[:vocab size] with name in {TOKENIZER_NAMES} "
                          "and a vocabulary size > 4")
    return name, int(size) if sep else None


def with_tokenizer(cfg, spec: str):
    """``cfg`` (an LM-FL config) with the tokenizer (and vocabulary size) of ``spec``."""
    name, size = parse_tokenizer(spec)
    return dataclasses.replace(cfg, tokenizer=name, vocab_size=size or cfg.vocab_size)


def prepare_data(cfg, progress: bool = True) -> Prepared:
    """Load ``cfg.corpus``, split by client, build the tokenizer, tokenize (Wang et al. §3.1)."""
    text = load_corpus(cfg, progress)
    if cfg.max_clients is not None and cfg.max_clients < len(text):
        ids = np.random.default_rng(cfg.seed).choice(len(text.client_ids), cfg.max_clients, replace=False)
        text = text.subset([text.client_ids[i] for i in sorted(ids)])
    tr, va, te = text.split_by_client(cfg.split, seed=cfg.seed)
    if cfg.tokenizer == "sentencepiece":  # public tokenizer: trained on the public pool only
        tok = train_sentencepiece(load_public(cfg, progress).texts, vocab_size=cfg.vocab_size)
    elif cfg.tokenizer == "word_public":  # top-k words of the public pool
        tok = WordTokenizer.fit(load_public(cfg, progress).texts, k=cfg.vocab_size - 4)
    elif cfg.tokenizer == "word":         # private top-k words of the training users (non-private)
        tok = WordTokenizer.fit(tr.texts(), k=cfg.vocab_size - 4)
    else:
        raise ValueError(f"tokenizer must be one of sentencepiece, word_public, word; got {cfg.tokenizer!r}")
    kw = dict(seq_len=cfg.seq_len, max_examples_per_client=cfg.max_examples_per_client,
              batch_size=cfg.batch_size, seed=cfg.seed)
    train_ds, val_ds, test_ds = (t.to_dataset(tok, **kw) for t in (tr, va, te))
    stats = {"corpus": cfg.corpus, "tokenizer": cfg.tokenizer, "vocab_size": tok.vocab_size,
             "vocabulary_public": cfg.tokenizer != "word",
             **{f"{n}_{k}": v for n, d in (("train", train_ds), ("val", val_ds), ("test", test_ds))
                for k, v in (("clients", len(d)), ("examples", d.total_examples),
                             ("tokens", d.total_tokens))}}
    return Prepared(train_ds, val_ds, test_ds, tok, stats, train_text=tr, test_text=te)


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
    from fedpriv.dp.adaptive import AdaptiveClipping
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


def algorithm_spec(name: str):
    """(mechanism factory or None, sampler kind) of algorithm ``name`` (``ALGORITHM_SPECS``);
    ``ConfigError`` naming an unknown algorithm or an unregistered mechanism."""
    if name not in ALGORITHM_SPECS:
        raise ConfigError(f"unknown algorithm {name!r}; one of {', '.join(ALGORITHM_SPECS)}")
    mechanism, sampler_kind = ALGORITHM_SPECS[name]
    try:
        return (None if mechanism is None else get_mechanism(mechanism)), sampler_kind
    except UnknownMechanism as e:
        raise ConfigError(f"algorithm {name!r}: {e}") from None


def build_algorithm(cfg, num_clients: int, loss_fn, prior_events=(), num_params: int | None = None):
    """Algorithm, sampler, the run's privacy event(s) and its noise multiplier.

    With ``target_epsilon``, z is calibrated so that ``prior_events`` (what a pipeline's ledger
    already spent on these users, e.g. FreD releases) composed with this run stay within it,
    under the sampler's neighbouring relation. ``num_params``: the model's size (``dp_ddg``'s
    accounting depends on it).
    """
    if cfg.cohort_size > num_clients:
        raise ValueError(f"cohort_size {cfg.cohort_size} > {num_clients} training clients")
    client_opt = optax.sgd(cfg.client_lr)
    server_opt = algs.server_optimizer(cfg.server_optimizer, cfg.server_lr, momentum=cfg.server_momentum)
    factory, sampler_kind = algorithm_spec(cfg.algorithm)
    sampler = SAMPLERS[sampler_kind](num_clients, cfg)
    if factory is None:  # no noise (FedAvg)
        alg = algs.build_algorithm(loss_fn, client_opt, server_opt, algs.DPConfig(clip_norm=cfg.clip_norm),
                                   sampler.expected_cohort_size, compute_dtype=client_compute_dtype(cfg))
        return alg, sampler, None, 0.0
    # the registered mechanism (fedpriv.dp.mechanisms), its run-dependent fields from the sampler
    options = {"mf_bands": getattr(cfg, "mf_bands", None), "ddg_bits": getattr(cfg, "ddg_bits", None),
               "num_params": num_params}  # (configs without MF or DDG lack the first two)
    fields = factory.run_fields(sampler, cfg.rounds, options)
    adaptive = adaptive_clipping(cfg)
    if adaptive is not None:
        fields = {**fields, "adaptive": adaptive}
    dp_of = lambda z: factory(clip_norm=cfg.clip_norm, noise_multiplier=z,  # noqa: E731
                              noise_cohort_size=cfg.noise_cohort_size, **fields)
    make = lambda z: algs.privacy_event(dp_of(z), sampler, cfg.rounds)  # noqa: E731
    pop = simulated_population(cfg)
    if cfg.noise_multiplier is not None:
        z = cfg.noise_multiplier
    elif cfg.target_epsilon is not None and pop is not None:
        # the paper-noise protocol: target_epsilon is the SIMULATED population's epsilon (the
        # paper's z for the paper's epsilon); the run is charged what it spends on our users
        if list(prior_events):
            raise ConfigError("a simulated population's epsilon cannot be targeted after earlier "
                              "releases on the same users (set noise_multiplier, or no simulated_population)")
        # calibrated over the paper's rounds (or the run's, if longer): the paper's per-round
        # noise; a shorter run's simulated epsilon (reported) is then below the target. With
        # adaptive clipping the count is charged to the population too (z raised to pay for it)
        z = pop.noise_multiplier(cfg.target_epsilon, cfg.delta, max(cfg.rounds, pop.rounds),
                                 count_noise=None if adaptive is None else adaptive.count_noise_multiplier)
    elif cfg.target_epsilon is not None:
        prior = list(prior_events)
        total = (lambda z: dpa.ComposedDpEvent(prior + [make(z)])) if prior else make
        # with the accountant the run reports ("best": PLD where it applies and is tighter), so
        # every algorithm reaches the same reported epsilon
        z = accounting.calibrate_noise_multiplier(total, cfg.target_epsilon, cfg.delta,
                                                  algs.neighboring_for(sampler), accountant="best")
    else:
        raise ValueError("a DP algorithm needs noise_multiplier or target_epsilon")
    dp = dp_of(z)
    alg = algs.build_algorithm(loss_fn, client_opt, server_opt, dp, sampler.expected_cohort_size,
                               compute_dtype=client_compute_dtype(cfg))
    return alg, sampler, algs.privacy_event(alg.dp, sampler, cfg.rounds), z  # what the loop charges


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


def tokenizer_accuracies(task, params, tokens: np.ndarray, tokenizer, batch_size: int,
                         sp_tokenizer=None) -> dict:
    """Accuracies that compare tokenizers (Wang et al. §3.1, Figure 1) on ``tokens`` ``int[N, L+1]``.

    ``accuracy_with_oov``: next-token accuracy with OOV (UNK) targets counted (right iff UNK is
    predicted). ``token_accuracy`` / ``token_accuracy_with_oov``: for a word-level ``tokenizer``
    with a SentencePiece ``sp_tokenizer``, the word predictions converted to next-token accuracy
    (each target word weighs as many tokens as SentencePiece splits it into; right iff the word
    is; ``word_ids_to_token_accuracy``); an OOV target's word is unknown after tokenization, so
    in the ``with_oov`` variant it weighs one token. For a subword tokenizer they are its own
    in-vocabulary accuracy and ``accuracy_with_oov``.
    """
    preds = predict_next(task, params, tokens, batch_size)
    with_oov = accuracy_with_oov(tokens, preds)
    out = {"accuracy_with_oov": with_oov}
    if isinstance(tokenizer, WordTokenizer):
        if sp_tokenizer is not None:
            targets = np.asarray(tokens)[:, 1:]
            ta = word_ids_to_token_accuracy(targets, preds, tokenizer, sp_tokenizer)
            unk = targets == UNK_ID
            n_unk, hit_unk = int(unk.sum()), int((unk & (preds == UNK_ID)).sum())
            total = ta.total_tokens + n_unk
            out.update(token_accuracy=ta.accuracy, word_accuracy=ta.word_accuracy,
                       token_accuracy_with_oov=(ta.correct_tokens + hit_unk) / total if total else float("nan"))
    else:
        out.update(token_accuracy=evaluate(task, params, tokens, batch_size)["accuracy"],
                   token_accuracy_with_oov=with_oov)
    return out


class PhaseTimer:
    """Wall and CPU seconds per phase of a run (``time.perf_counter`` / ``time.process_time``),
    accumulated over calls: ``with phases("data"): ...`` or ``phases.timed(name, fn)``.
    ``exclude``: phases timed inside this one are subtracted from it (no double counting).
    ``as_dict()``: ``{phase: {"wall": s, "cpu": s}}`` (this session only; a resumed run's
    earlier sessions are not included)."""

    def __init__(self):
        self.wall: dict = {}
        self.cpu: dict = {}

    def __call__(self, name: str, exclude=()):
        import contextlib

        @contextlib.contextmanager
        def phase():
            before = {k: (self.wall.get(k, 0.0), self.cpu.get(k, 0.0)) for k in exclude}
            t, c = time.perf_counter(), time.process_time()
            try:
                yield
            finally:
                dw, dc = time.perf_counter() - t, time.process_time() - c
                for k, (w0, c0) in before.items():
                    dw -= self.wall.get(k, 0.0) - w0
                    dc -= self.cpu.get(k, 0.0) - c0
                self.wall[name] = self.wall.get(name, 0.0) + dw
                self.cpu[name] = self.cpu.get(name, 0.0) + dc
        return phase()

    def timed(self, name: str, fn):
        def wrapped(*a, **k):
            with self(name):
                return fn(*a, **k)
        return wrapped

    def as_dict(self) -> dict:
        return {k: {"wall": round(self.wall[k], 3), "cpu": round(self.cpu[k], 3)} for k in self.wall}


def run_lm_fl(cfg, workdir: str, *, prepared: Prepared | None = None, init_params=None,
        ledger: PrivacyLedger | None = None, progress: bool = True, log=print,
        stage: str = "fl-training", sp_tokenizer=None) -> dict:
    """Train per ``cfg``; write ``metrics.jsonl``, ``summary.{json,md}``, ``learning_curve.png``.

    ``init_params`` (e.g. a publicly pre-trained checkpoint) and ``ledger`` (a pipeline's
    shared budget) are optional; by default the ledger's budget is this run's epsilon.
    ``stage`` names the run in the ledger and tags its PRNG keys (one per run on the same users).
    The summary has ``val_accuracy_round0`` (the initial model, Wang et al. Table 1's round-0
    column) and the :func:`tokenizer_accuracies` of the final model on validation (``val_``
    prefixed; ``sp_tokenizer`` converts a word model's accuracy to next-token accuracy).
    """
    t0 = time.time()
    os.makedirs(workdir, exist_ok=True)
    phases = PhaseTimer()
    with phases("data"):
        prepared = prepared or prepare_data(cfg, progress)
    task = build_task(cfg, prepared.tokenizer.vocab_size)
    params = init_params if init_params is not None else task.init(jax.random.key(cfg.seed))
    ids = list(prepared.train.client_ids)
    prior = ledger.dp_events() if ledger is not None else ()
    alg, sampler, event, z = build_algorithm(cfg, len(ids), task.loss_fn, prior,
                                             num_params=count_params(params))
    eps = eps_real = None
    if event is not None:
        rel = algs.neighboring_for(sampler)
        eps, acc_name = accounting.compute_epsilon(event, cfg.delta, rel)  # this run alone
        if cfg.noise_cohort_size is not None:
            real = algs.privacy_event(alg.dp, sampler, cfg.rounds, simulated=False)
            eps_real = accounting.compute_epsilon(real, cfg.delta, rel)[0]
        if ledger is None:
            ledger = PrivacyLedger(eps * (1 + 1e-6), cfg.delta, neighboring=rel)
        if not prepared.stats.get("vocabulary_public", True) and ledger.entry(PRIVATE_VOCABULARY) is None:
            ledger.record_nonprivate(PRIVATE_VOCABULARY, note=(
                f"NON-PRIVATE: the top-{cfg.vocab_size - 4} words of the training users' text (Wang "
                "et al.'s word-tokenizer baseline); the DP epsilon holds only if it is taken as public"))
    val = prepared.val.concat_examples()["tokens"][: cfg.max_eval_examples]
    eval_fn = phases.timed("evaluation", lambda p: evaluate(task, p, val, cfg.eval_batch_size))
    round0 = eval_fn(params)["accuracy"]

    def log_row(row):
        if "eval_accuracy" in row:
            extra = (f", epsilon spent {row['epsilon_spent']:.3f} (the whole run, charged before round 0)"
                     if "epsilon_spent" in row else "")
            log(f"round {row['round']:5d}: val accuracy {row['eval_accuracy']:.4f}, "
                f"val loss {row['eval_loss']:.3f}{extra}")

    noise_note, pn = "", None
    if cfg.algorithm != "fedavg":
        noise_note = (f"{cfg.algorithm}: z = {z:.4f}, clip {cfg.clip_norm}, epsilon = {eps:.3f} at delta = "
                      f"{cfg.delta:g} (user-level)")
        if cfg.noise_cohort_size is not None:
            noise_note += (f"; trains with cohort {cfg.cohort_size} but adds the noise of a cohort of "
                           f"{cfg.noise_cohort_size}: the epsilon is that of the simulated population "
                           f"{len(ids) * cfg.noise_cohort_size // cfg.cohort_size}; the run actually "
                           f"executed has epsilon = {eps_real:.3g}")
        # the paper-noise pair's "spent" side is the run executed on our users
        pn = paper_noise(cfg, z, alg, sampler, len(ids))
        if pn is not None:
            noise_note += "; paper-noise protocol: " + pn.line()
        log(noise_note)
    with phases("training (rounds, compile, checkpoints; without evaluation)", exclude=("evaluation",)):
        result = train(alg, params, prepared.train, ids, sampler, rounds=cfg.rounds, batch_size=cfg.batch_size,
                     seed=cfg.seed, workdir=workdir, max_steps=cfg.max_local_steps, eval_fn=eval_fn,
                     eval_every=cfg.eval_every, checkpoint_every=cfg.checkpoint_every, ledger=ledger,
                     stage=stage, fingerprint=run_fingerprint(cfg), progress=progress, log_fn=log_row,
                     lanes=cfg.lanes, batching=getattr(cfg, "batching", "auto"), log=log)
    if result.ledger is not None:  # the cost recorded for this run (more if a resume extended it)
        mine = next(e for e in result.ledger.report()["entries"] if e["name"] == stage)
        eps, eps_real = mine["epsilon_alone"], mine.get("epsilon_executed_alone", eps_real)
    if_public = {}
    if result.ledger is not None and result.ledger.nonprivate_entries:
        # a non-private choice (the vocabulary) was recorded: the run's epsilon is infinite;
        # beside it, the epsilon that holds if that choice is taken as public
        if_public = {"epsilon_if_vocabulary_public": eps, "epsilon_executed_run_if_vocabulary_public": eps_real,
                     "nonprivate_entries": result.ledger.nonprivate_entries}
        eps, eps_real = float("inf"), (float("inf") if eps_real is not None else None)
        noise_note += (f"; NON-PRIVATE vocabulary (top-k words of the training users): epsilon = inf; "
                       f"{if_public['epsilon_if_vocabulary_public']:.3f} if the vocabulary is taken as public")
    final = (result.evals[-1] if result.evals and result.evals[-1]["round"] == cfg.rounds
             else {f"eval_{k}": v for k, v in eval_fn(result.state.params).items()})
    curve = report.metric_curve(workdir, "eval_accuracy")
    test = prepared.test.concat_examples()["tokens"][: cfg.max_eval_examples]
    with phases("evaluation"):
        test_metrics = evaluate(task, result.state.params, test, cfg.eval_batch_size)
        tok_acc = tokenizer_accuracies(task, result.state.params, val, prepared.tokenizer,
                                       cfg.eval_batch_size, sp_tokenizer)
    train_tokens = prepared.train.concat_examples()["tokens"]
    # a rerun of a finished run trains nothing: keep its recorded training time; a resumed run
    # adds this session's time to what the interrupted session recorded (if it got that far)
    elapsed, prev = time.time() - t0, _previous_wall_clock(workdir)
    wall = (prev if result.resumed_from >= cfg.rounds and prev is not None
            else elapsed + (prev or 0.0) if result.resumed_from > 0 else elapsed)
    summary = {
        "algorithm": cfg.algorithm, "noise_multiplier": z, "epsilon": eps, "delta": cfg.delta,
        "epsilon_executed_run": eps_real, **if_public, "unit_of_privacy": "user", "noise_note": noise_note,
        "rounds": cfg.rounds, "cohort_size": cfg.cohort_size, "noise_cohort_size": cfg.noise_cohort_size,
        "paper_noise": None if cfg.algorithm == "fedavg" or pn is None else pn.as_dict(),
        "val_accuracy": final.get("eval_accuracy"), "val_loss": final.get("eval_loss"),
        "val_accuracy_round0": round0,
        **{f"val_{k}": v for k, v in tok_acc.items()},
        "test_accuracy": test_metrics["accuracy"], "test_loss": test_metrics["loss"],
        "most_frequent_token_val_accuracy": most_frequent_token_accuracy(train_tokens, val),
        "num_params": count_params(result.state.params), "wall_clock_s": wall,
        "phase_seconds": phases.as_dict(),
        "resumed_from_round": result.resumed_from, "data": prepared.stats,
        "ledger": result.ledger.report() if result.ledger else None,
        "curve": curve, "outputs": outputs(prepared.stats.get("vocabulary_public", True)),
        **report.run_record(cfg, cfg.seed),
    }
    report.save_json(summary, os.path.join(workdir, "summary.json"))
    _write_summary_md(summary, workdir)
    if curve:
        xs, ys = zip(*curve)
        report.plot_curves({cfg.algorithm: (list(xs), list(ys))}, os.path.join(workdir, "learning_curve.png"),
                           "round", "validation accuracy (in-vocab)", f"{cfg.corpus}: {cfg.arch} LM")
    return summary


def run_variants(lm_cfg, seeds, variants, workdir: str, *, progress: bool = True) -> list[dict]:
    """Run (or read back, once finished) every ``(label, name, overrides)`` of ``variants`` on
    ``lm_cfg`` for each seed, in ``workdir/seed<S>-<name>``; the data are prepared once per seed.

    Returns one dict per (seed, variant): ``label``, ``seed``, ``workdir``, the run's ``summary``
    and its comparison fields (``epsilon``, ``epsilon_executed_run``, ``noise_multiplier``,
    ``val_accuracy``, ``test_accuracy``, ``s_per_round``, ``baseline`` = most-frequent token)."""
    out = []
    for seed in seeds:
        base = dataclasses.replace(lm_cfg, seed=seed)
        prepared = prepare_data(base, progress)
        for label, name, overrides in variants:
            sub = os.path.join(workdir, f"seed{seed}-{name}")
            done = os.path.join(sub, "summary.json")
            if os.path.exists(done):
                with open(done) as f:
                    s = json.load(f)
            else:
                s = run_lm_fl(dataclasses.replace(base, **overrides), sub, prepared=prepared,
                              progress=progress, stage=f"fl-training ({label})")
            out.append({"label": label, "seed": seed, "workdir": sub, "summary": s,
                        **{k: s[k] for k in ("epsilon", "epsilon_executed_run", "noise_multiplier",
                                             "val_accuracy", "test_accuracy")},
                        "s_per_round": s["wall_clock_s"] / base.rounds,
                        "baseline": s["most_frequent_token_val_accuracy"]})
    return out


def _previous_wall_clock(workdir: str):
    """``wall_clock_s`` of the summary a previous session wrote in ``workdir`` (None if none)."""
    try:
        with open(os.path.join(workdir, "summary.json")) as f:
            return float(json.load(f)["wall_clock_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


PRIVATE_VOCABULARY = "vocabulary (top-k words of the training users)"


def outputs(vocabulary_public: bool = True) -> dict:
    """Which outputs of the run the ledger covers (the run record)."""
    from fedpriv.fl.loop import OUTPUTS
    out = {"covered_by_ledger": ["trained model / checkpoints"],
           "not_covered": ["val_*, test_*, most_frequent_token_val_accuracy, eval_* in "
                           "metrics.jsonl (exact evaluation on held-out private users)"],
           "metrics.jsonl": OUTPUTS}
    if not vocabulary_public:
        out["not_covered"].append("the vocabulary (top-k words of the training users: recorded "
                                  "in the ledger as non-private, epsilon = inf)")
    return out


def _write_summary_md(s: dict, workdir: str) -> None:
    rows = [{"metric": k, "value": s[k]} for k in
            ("algorithm", "epsilon", "delta", "epsilon_executed_run", *(
                ("epsilon_if_vocabulary_public", "epsilon_executed_run_if_vocabulary_public")
                if "epsilon_if_vocabulary_public" in s else ()), "noise_multiplier", "rounds",
             "cohort_size", "noise_cohort_size", "val_accuracy", "test_accuracy",
             "most_frequent_token_val_accuracy", "num_params", "wall_clock_s", "seed")]
    pn = s.get("paper_noise")
    if pn:  # the paper-noise protocol: both epsilons, each naming its population
        rows[2:2] = [{"metric": "epsilon_simulated (declared population)", "value": pn["epsilon_simulated"]},
                     {"metric": "simulated population", "value": pn["population"]},
                     {"metric": "epsilon_executed (spent on our users, charged)", "value": pn["epsilon_executed"]},
                     {"metric": "our users", "value": pn["our_users"]}]
    rows += [{"metric": k, "value": v} for k, v in s["data"].items()]
    report.write_table(rows, workdir, "summary", ["metric", "value"],
                       title="Private FL of an on-device LM", notes=[s["noise_note"] or "non-private",
                                                                      "unit of privacy: user"])
