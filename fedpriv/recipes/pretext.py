"""The PrE-Text comparison (issue 26; Hou et al., ICML 2024): the three arms of
``configs/pre_text.py`` per (seed, epsilon), each with its own ledger of budget epsilon on the
training users, and their client costs.

Layout of a workdir: ``seed<S>-eps<E>-<arm>/`` per arm (``summary.json`` when finished: a
finished arm is read back, never rerun; the DP-FTRL arms resume from their checkpoints),
``public-seed<S>/`` the arms' common start (``public_init``: pre-trained on the public pool),
and, in the fedpriv cache, the public embedder's vectors of the users' voting messages
(`embed_store`: computed once, shared by seeds and workdirs).

Privacy (docs/privacy.md): the votes (`fedpriv.synth.release`) and DP-FTRL are both charged to
the arm's ``PrivacyLedger`` (add/remove one user) before any private data is read; the votes'
sampler is a shuffled pass of ``vote_cohort`` users per round, so with ``pe_rounds x
vote_cohort <=`` users every user votes at most once and the T rounds cost one Gaussian release
(``ShuffledPassSampler.amplified_event``). Everything after a release (selection, the LLM's
variations, central training on the synthetic set) is post-processing.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import time

import jax
import numpy as np

from fedpriv import report
from fedpriv.data.federated import encode_examples
from fedpriv.dp import accounting
from fedpriv.dp.keys import tagged_key
from fedpriv.dp.ledger import PrivacyLedger
from fedpriv.fl.samplers import ShuffledPassSampler
from fedpriv.models.metrics import evaluate, most_frequent_token_accuracy
from fedpriv.recipes import lm
from fedpriv.synth import evolve as E, release as R

__all__ = ["fred_rows", "public_init", "truncated_teacher", "vote_sampler", "vote_noise", "ft_vote_epsilon", "settings",
           "client_costs", "run_arms", "server_lr_at", "ARM_LABELS"]

ARM_LABELS = {"ondevice": "(a) on-device DP-FTRL", "synthetic": "(b) PrE-Text synthetic only",
              "synthetic_ft": "(c) PrE-Text pre-training + DP-FTRL",
              "public": "(0) public pre-training only (no private data)"}
EMBED_DIM = 384  # all-MiniLM-L6-v2


def server_lr_at(cfg, epsilon: float) -> float:
    """The DP-FTRL server lr of the arms at ``epsilon``: ``cfg.epsilon_server_lrs`` (one per
    epsilon, chosen on validation per budget) or, without it, ``cfg.lm.server_lr``."""
    lrs = getattr(cfg, "epsilon_server_lrs", None)
    return cfg.lm.server_lr if lrs is None else lrs[list(cfg.epsilons).index(epsilon)]


def truncated_teacher(teacher, layers: int | None):
    """``teacher`` with only its first ``layers`` blocks (None: unchanged): the same tokenizer,
    embeddings and head, a cheaper and worse generator (smoke tests). Its fingerprint says so."""
    if layers is None or layers >= teacher.config.n_layers:
        return teacher
    params = dict(teacher.params, layers=jax.tree.map(lambda a: a[:layers], teacher.params["layers"]))
    return dataclasses.replace(teacher, params=params,
                               config=dataclasses.replace(teacher.config, n_layers=layers),
                               fingerprint=f"{teacher.fingerprint}-first{layers}layers")


def vote_sampler(cfg, num_clients: int, seed: int) -> ShuffledPassSampler:
    if cfg.vote_cohort > num_clients:
        from fedpriv.data.errors import ConfigError
        raise ConfigError(f"vote_cohort {cfg.vote_cohort} > {num_clients} training users")
    return ShuffledPassSampler(num_clients, cfg.vote_cohort, seed=seed)


def vote_noise(cfg, num_clients: int, epsilon: float) -> float:
    """z of the votes alone at ``epsilon`` (``delta`` of the LM config), as the ledger accounts."""
    sampler = vote_sampler(cfg, num_clients, 0)  # the event does not depend on the seed
    return accounting.calibrate_noise_multiplier(
        lambda z: R.votes_event(sampler, cfg.pe_rounds, z), epsilon, cfg.lm.delta,
        sampler.neighboring)


def ft_vote_epsilon(cfg, epsilon: float) -> float:
    """The votes' epsilon (alone) in the ``synthetic_ft`` arm."""
    return cfg.ft_vote_share * epsilon


def settings(cfg) -> E.EvolveSettings:
    return E.EvolveSettings(num_samples=cfg.num_samples, keep_fraction=cfg.keep_fraction,
                            expansion=cfg.expansion, max_new=cfg.max_new, temperature=cfg.temperature,
                            top_k=cfg.top_k, batch_size=cfg.gen_batch_size, prefix_min=cfg.prefix_min,
                            prefix_max=cfg.prefix_max)


def client_costs(cfg, arm: str, num_params: int, mean_tokens: float, mean_messages: float,
                 z_rounds: int, num_clients: int | None = None) -> dict:
    """A participating client's cost per round and the rounds it takes part in (a closed-form
    cost model, not a measurement): bytes down/up (float32) and FLOPs (6 x params per trained
    token for an LSTM step, forward + backward; the embedder's 2 x 22.7M per token, 16 tokens per
    message assumed; nearest-neighbour scoring 2 x d x N per message). With ``num_clients``, each
    phase also has ``per_user``: the expected participations of one user over the run
    (rounds x cohort / users) -- ``flops x per_user`` is a user's total compute."""
    c = cfg.lm
    train_tokens = (c.max_local_steps or 1) * c.batch_size * mean_tokens
    fl = {"down_bytes": 4 * num_params, "up_bytes": 4 * num_params,
          "flops": 6 * num_params * train_tokens, "rounds": z_rounds}
    vote = {"down_bytes": 4 * EMBED_DIM * cfg.num_samples, "up_bytes": 4 * cfg.num_samples,
            "flops": mean_messages * (2 * 22.7e6 * 16 + 2 * EMBED_DIM * cfg.num_samples),
            "rounds": cfg.pe_rounds}
    if num_clients:
        fl["per_user"] = z_rounds * c.cohort_size / num_clients
        vote["per_user"] = cfg.pe_rounds * cfg.vote_cohort / num_clients
    return {"ondevice": {"fl": fl}, "synthetic": {"votes": vote},
            "synthetic_ft": {"votes": vote, "fl": fl}}[arm]


# ------------------------------------------------------------------------------ data


def _client_messages(prepared, cfg) -> list[list[str]]:
    """Each training user's voting messages, in the order of ``prepared.train.client_ids`` (the
    samplers' indices): at most ``messages_per_client``, a sample seeded by the user's id (not
    the run's seed: a user votes with the same messages in every seed's split, so their
    embeddings are computed once)."""
    from fedpriv.data.cache import texts_digest
    out = []
    for cid in prepared.train.client_ids:
        msgs = prepared.train_text[cid]
        if len(msgs) > cfg.messages_per_client:
            rng = np.random.default_rng(int(texts_digest([cid])[:8], 16))
            msgs = [msgs[j] for j in sorted(rng.choice(len(msgs), cfg.messages_per_client, replace=False))]
        out.append(msgs)
    return out


def embed_store(embedder, texts: list[str], progress: bool = True) -> dict:
    """text -> unit embedding of the public embedder, for every distinct text, from a store in
    the fedpriv cache (``$FEDPRIV_CACHE`` or ``~/.cache/fedpriv``; public-model outputs of the
    user's own local data, never shipped): only texts missing from it are embedded, then the
    store is replaced atomically."""
    from fedpriv.data.cache import resolve_cache_dir, try_write
    path = resolve_cache_dir() / "pretext-minilm-embeddings.npz"
    known: dict = {}
    if path.exists():
        with np.load(path, allow_pickle=False) as z:
            known = dict(zip(z["texts"].tolist(), z["emb"]))
    missing = sorted(set(texts) - set(known))
    if missing:
        emb = embedder.embed(missing, batch_size=64, progress=progress)
        known.update(zip(missing, emb))
        keys = sorted(known)
        # best effort (an unwritable cache is bypassed with one warning); np.savez to a file
        # object keeps the name, so the atomic temporary file is not renamed to *.npz.npz
        try_write(path, lambda f: np.savez(f, texts=np.asarray(keys), emb=np.stack([known[k] for k in keys])))
    return {t: known[t] for t in set(texts)}


# ------------------------------------------------------------------------------ the arms


def _perplexity(loss: float) -> float:
    """exp(loss); inf for a diverged model (loss beyond float range) or a non-finite loss."""
    return math.exp(loss) if math.isfinite(loss) and loss < 700 else math.inf


# fields that do not identify an arm's computation (the invocation's lists, bookkeeping, the
# FreD table's evaluation)
_NOT_IDENTITY = {"seeds", "epsilons", "arms", "fred_test_messages"}
_LM_NOT_IDENTITY = {"seed", "target_epsilon", "noise_multiplier", "eval_every", "checkpoint_every",
                    "lanes"}


def _identity(config: dict, epsilon: float | None = None) -> dict:
    """What identifies an arm's computation in ``config`` (a dict). With ``epsilon``: the server
    lr the arm used there (``epsilon_server_lrs``' entry, else lm's) in place of the list, so an
    arm run by an invocation with other epsilons (e.g. one epsilon per process) is the same."""
    out = {k: v for k, v in config.items() if k not in _NOT_IDENTITY and k != "lm"}
    out["lm"] = {k: v for k, v in config["lm"].items() if k not in _LM_NOT_IDENTITY}
    if epsilon is not None:
        eps = [float(e) for e in config.get("epsilons") or ()]
        lrs = out.get("epsilon_server_lrs")
        if not lrs or float(epsilon) in eps:  # else: the list stays (no match: refused, fail closed)
            out.pop("epsilon_server_lrs", None)
            if lrs:
                out["lm"]["server_lr"] = float(lrs[eps.index(float(epsilon))])
    return json.loads(json.dumps(out, default=str))  # tuples and lists compare equal


@functools.lru_cache(maxsize=3)
def prepared_data(lm_cfg):
    """``lm.prepare_data(lm_cfg)`` once per (frozen, hashable) LM config in this process: the
    arms, the FreD table and the sample table of one invocation share it."""
    return lm.prepare_data(lm_cfg, progress=False)


def _read(sub: str, cfg=None, epsilon: float | None = None):
    """A finished arm's summary (None if unfinished). With ``cfg``: it must have run this
    config's computation (``_identity`` at ``epsilon``), else ``ConfigError`` (a workdir never
    mixes settings)."""
    try:
        with open(os.path.join(sub, "summary.json")) as f:
            s = json.load(f)
    except (OSError, ValueError):
        return None
    if cfg is not None:
        theirs = s.get("config") or {"lm": {}}
        at = epsilon if epsilon is not None and "epsilons" in theirs else None
        mine, theirs = _identity(dataclasses.asdict(cfg), at), _identity(theirs, at)
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k) and k != "lm")
        diff += sorted(f"lm.{k}" for k in set(mine["lm"]) | set(theirs["lm"])
                       if mine["lm"].get(k) != theirs["lm"].get(k))
        if diff:
            from fedpriv.data.errors import ConfigError
            raise ConfigError(f"{sub} holds a finished arm run with other settings ({', '.join(diff[:5])}"
                              f"{', ...' if len(diff) > 5 else ''}): use another workdir")
    return s


def _pretext(cfg, teacher, embedder, clients_emb, num_clients, seed, eps_votes, ledger, sub, log):
    """One PrE-Text run charged to ``ledger``: returns (result, z) and writes synthetic.jsonl."""
    z = vote_noise(cfg, num_clients, eps_votes)
    plan = R.plan_votes(ledger, vote_sampler(cfg, num_clients, seed), cfg.pe_rounds, z,
                        tagged_key(seed, "pretext", "votes"), k=cfg.vote_k)
    prompts = [E.chat_prompt(teacher, s) for s in cfg.instructions]
    res = E.evolve(teacher, lambda t: embedder.embed(t, cfg.embed_batch, progress=False), plan, clients_emb, prompts,
                   settings(cfg), tagged_key(seed, "pretext", "generate"), log=log)
    os.makedirs(sub, exist_ok=True)
    with open(os.path.join(sub, "synthetic.jsonl"), "w") as f:
        for t in res.texts:
            f.write(json.dumps({"text": t}) + "\n")
    return res, z


def public_init(cfg, task, tokenizer, seed, workdir, progress=True):
    """Every arm's starting params for ``seed``: ``cfg.init == "public"``: the LSTM trained
    centrally (Adam, ``public_steps`` x ``synth_batch_size`` sentences, ``public_lr``) on the
    public pool, no private data, checkpointed in ``workdir/public-seed<S>`` (resumed, shared
    by the arms and epsilons); ``"scratch"``: ``task.init`` (random)."""
    params = task.init(jax.random.key(seed))
    if cfg.init == "scratch":
        return params
    from fedpriv.public.pretrain import adam_with_clipping, train_central
    ids = tokenizer.encode(list(lm.load_public(cfg.lm, progress=False).texts))
    data = {"tokens": encode_examples([i for i in ids if i], cfg.lm.seq_len)}
    params, _ = train_central(task.loss_fn, params, data, steps=cfg.public_steps,
                              batch_size=cfg.synth_batch_size, seed=seed,
                              optimizer=adam_with_clipping(cfg.public_lr),
                              workdir=os.path.join(workdir, f"public-seed{seed}"),
                              fingerprint={"public_lr": cfg.public_lr}, progress=progress,
                              desc="public pre-training", log=None)
    return params


def _train_synthetic(cfg, task, texts, tokenizer, seed, sub, progress, params):
    """``params`` (the arms' start) trained centrally on the synthetic texts (Adam)."""
    from fedpriv.public.pretrain import adam_with_clipping, train_central
    ids = tokenizer.encode(list(texts))
    data = {"tokens": encode_examples([i for i in ids if i], cfg.lm.seq_len)}
    params, _ = train_central(task.loss_fn, params, data, steps=cfg.synth_steps,
                              batch_size=cfg.synth_batch_size, seed=seed,
                              optimizer=adam_with_clipping(cfg.synth_lr), workdir=os.path.join(sub, "central"),
                              fingerprint={"synth_lr": cfg.synth_lr}, progress=progress,
                              desc="synthetic training", log=None)
    return params


def prepare_shared(cfg, workdir: str, progress: bool = True) -> None:
    """What the (seed, epsilon, arm) runs of ``cfg`` share, computed once: each seed's public
    start (``public_init``, checkpointed in ``workdir``) and, for the PrE-Text arms, the
    embeddings of the training users' messages (the on-disk store of ``embed_store``). The
    run executor calls it before dispatching the arms to workers, which would race to compute
    them."""
    from fedpriv.models.bert import load_embedder
    embedder = None
    for seed in cfg.seeds:
        base = dataclasses.replace(cfg.lm, seed=seed)
        prepared = prepared_data(base)
        public_init(cfg, lm.build_task(base, prepared.tokenizer.vocab_size), prepared.tokenizer, seed, workdir,
                    progress)
        if any(arm != "ondevice" for arm in cfg.arms):
            embedder = embedder or load_embedder()
            embed_store(embedder, [m for ms in _client_messages(prepared, cfg) for m in ms], progress)


def narrow(cfg, seed: int, epsilon: float, arm: str):
    """The config of one (seed, epsilon, arm) run: the arm's server lr at ``epsilon``
    (``server_lr_at``) in ``lm`` in place of ``epsilon_server_lrs`` -- the same computation
    (``_identity`` at that epsilon) as in the whole table."""
    return dataclasses.replace(cfg, seeds=(seed,), epsilons=(epsilon,), arms=(arm,), epsilon_server_lrs=None,
                               lm=dataclasses.replace(cfg.lm, server_lr=server_lr_at(cfg, epsilon)))


def run_arms(cfg, workdir: str, *, teacher=None, embedder=None, progress: bool = True,
             log=print) -> list[dict]:
    """Every (seed, epsilon, arm) of ``cfg``: one row each (module docstring)."""
    from fedpriv.models.bert import load_embedder
    from fedpriv.models.gguf import load_teacher
    rows = []
    for seed in cfg.seeds:
        base = dataclasses.replace(cfg.lm, seed=seed)
        prepared = prepared_data(base)
        n = len(prepared.train.client_ids)
        task = lm.build_task(base, prepared.tokenizer.vocab_size)
        test = prepared.test.concat_examples()["tokens"][: base.max_eval_examples]
        train_tokens = prepared.train.concat_examples()["tokens"]
        trivial = most_frequent_token_accuracy(train_tokens, test)
        val = prepared.val.concat_examples()["tokens"][: base.max_eval_examples]
        trivial_val = most_frequent_token_accuracy(train_tokens, val)
        msgs = _client_messages(prepared, cfg)
        lengths = (train_tokens[:, 1:] > 0).sum(axis=1)
        mean_tokens, mean_msgs = float(lengths.mean()), float(np.mean([len(m) for m in msgs]))
        clients_emb = None
        start = public_init(cfg, task, prepared.tokenizer, seed, workdir, progress)
        pub = evaluate(task, start, test, base.eval_batch_size) if cfg.init == "public" else None
        for eps in cfg.epsilons:
            if pub is not None:  # the reference: the start alone, at every epsilon's table
                rows.append({"arm": ARM_LABELS["public"], "arm_key": "public", "seed": seed, "epsilon": eps,
                             "test_accuracy": pub["accuracy"], "test_loss": pub["loss"],
                             "test_perplexity": _perplexity(pub["loss"]), "trivial_accuracy": trivial,
                             "epsilon_spent": 0.0, "z_votes": None, "z_fl": None, "costs": {},
                             "seconds": {}, "generated_tokens": 0,
                             "workdir": os.path.join(workdir, f"public-seed{seed}")})
            for arm in cfg.arms:
                sub = os.path.join(workdir, f"seed{seed}-eps{eps:g}-{arm}")
                s = _read(sub, cfg, eps)
                if s is None:
                    if arm != "ondevice" and clients_emb is None:
                        teacher = truncated_teacher(teacher or load_teacher(), cfg.teacher_layers)
                        embedder = embedder or load_embedder()
                        table = embed_store(embedder, [m for ms in msgs for m in ms], progress)
                        clients_emb = [np.stack([table[m] for m in ms]) if ms else
                                       np.zeros((0, EMBED_DIM), np.float32) for ms in msgs]
                    log(f"[seed {seed}, eps {eps:g}] {ARM_LABELS[arm]}")
                    s = _run_arm(cfg, arm, base, prepared, task, test, val, teacher, embedder,
                                 clients_emb, n, seed, eps, sub, progress, log, start)
                costs = client_costs(cfg, arm, s["num_params"], mean_tokens, mean_msgs,
                                     cfg.lm.rounds, n)
                rows.append({"arm": ARM_LABELS[arm], "arm_key": arm, "seed": seed, "epsilon": eps,
                             "test_accuracy": s["test_accuracy"], "test_loss": s["test_loss"],
                             "test_perplexity": _perplexity(s["test_loss"]),
                             "trivial_accuracy": trivial, "epsilon_spent": s["epsilon_spent"],
                             "z_votes": s.get("z_votes"), "z_fl": s.get("z_fl"),
                             "costs": costs, "seconds": s.get("seconds", {}),
                             "generated_tokens": s.get("generated_tokens", 0), "workdir": sub,
                             "server_lr": s.get("server_lr"), "val_accuracy": s.get("val_accuracy"),
                             "val_accuracy_round0": s.get("val_accuracy_round0"),
                             "val_curve": s.get("val_curve"), "trivial_val_accuracy": trivial_val})
    return rows


def _run_arm(cfg, arm, base, prepared, task, test, val, teacher, embedder, clients_emb, n, seed, eps,
             sub, progress, log, start) -> dict:
    """One arm from the params ``start`` (``public_init``), in its own ledger of budget ``eps``."""
    os.makedirs(sub, exist_ok=True)
    t0 = time.time()
    ledger = PrivacyLedger(eps * (1 + 1e-6), cfg.lm.delta, neighboring="add_remove")
    out = {"seconds": {}}
    init = start
    if arm in ("synthetic", "synthetic_ft"):
        eps_v = eps if arm == "synthetic" else ft_vote_epsilon(cfg, eps)
        res, z_v = _pretext(cfg, teacher, embedder, clients_emb, n, seed, eps_v, ledger, sub, log)
        out.update(z_votes=z_v, pretext_history=res.history, generated_tokens=res.generated_tokens,
                   synthetic_samples=len(res.texts), examples=res.texts[:20],
                   initial_examples=res.initial_texts[:10])
        out["seconds"].update({f"pretext {k}": v for k, v in res.seconds.items()})
        t1 = time.time()
        init = _train_synthetic(cfg, task, res.texts, prepared.tokenizer, seed, sub, progress, start)
        out["seconds"]["synthetic training"] = time.time() - t1
    if arm == "synthetic":
        m = evaluate(task, init, test, cfg.lm.eval_batch_size)
        out.update(test_accuracy=m["accuracy"], test_loss=m["loss"], num_params=lm.count_params(init),
                   val_accuracy=evaluate(task, init, val, cfg.lm.eval_batch_size)["accuracy"])
    else:
        t1 = time.time()
        lr = server_lr_at(cfg, eps)
        s = lm.run_lm_fl(dataclasses.replace(base, target_epsilon=eps, server_lr=lr), os.path.join(sub, "fl"),
                         prepared=prepared, init_params=init, ledger=ledger, progress=progress,
                         log=log, stage="fl-training")
        out["seconds"]["dp-ftrl"] = time.time() - t1
        out.update(test_accuracy=s["test_accuracy"], test_loss=s["test_loss"],
                   num_params=s["num_params"], z_fl=s["noise_multiplier"], server_lr=lr,
                   val_accuracy=s.get("val_accuracy"), val_accuracy_round0=s.get("val_accuracy_round0"),
                   # validation accuracy every eval_every rounds (rounds-to-match: experiments.pre_text)
                   val_curve=report.metric_curve(os.path.join(sub, "fl"), "eval_accuracy"))
    rep = ledger.report()
    out["epsilon_spent"] = rep["spent_epsilon"]
    out["ledger"] = rep
    out["seconds"]["total"] = time.time() - t0
    out.update(report.run_record(cfg, seed))
    report.save_json(out, os.path.join(sub, "summary.json"))
    return out


def fred_rows(cfg, rows: list[dict], *, embedder=None, progress: bool = True) -> list[dict]:
    """The Fréchet distance (FreD, Hou et al. 2023; non-private, an evaluation like the test
    accuracy) of each released synthetic set to the test users' messages, beside two anchors of
    the same size per seed: a uniform sample of the public pool (no private signal) and of the
    training users' messages (the private distribution itself). The test users' messages are
    all of them, or a uniform sample of ``cfg.fred_test_messages`` (seeded by the seed). One row
    per (seed, set)."""
    from fedpriv.fred.distance import fred_nonprivate
    from fedpriv.models.bert import load_embedder
    embedder = embedder or load_embedder()
    pool = lm.load_public(cfg.lm, progress=False).texts
    out = []
    for seed in cfg.seeds:
        mine = [r for r in rows if r["seed"] == seed and r["arm_key"] in ("synthetic", "synthetic_ft")]
        if not mine:
            continue
        prepared = prepared_data(dataclasses.replace(cfg.lm, seed=seed))
        test = [m for cid in prepared.test_text.client_ids for m in prepared.test_text[cid]]
        cap = getattr(cfg, "fred_test_messages", None)
        if cap is not None and cap < len(test):
            pick = np.random.default_rng([seed, 1]).choice(len(test), cap, replace=False)
            test = [test[i] for i in sorted(pick)]
        table = embed_store(embedder, test, progress)
        test_emb = np.stack([table[m] for m in test])
        sets = {}
        for r in mine:
            with open(os.path.join(r["workdir"], "synthetic.jsonl")) as f:
                sets[f"{r['arm']} (eps {r['epsilon']:g})"] = [json.loads(x)["text"] for x in f]
        size = max(len(v) for v in sets.values())
        rng = np.random.default_rng(seed)
        train = [m for ms in _client_messages(prepared, cfg) for m in ms]
        sets["public pool sample"] = [pool[i] for i in rng.choice(len(pool), size, replace=False)]
        sets["training users' messages"] = [train[i] for i in rng.choice(len(train), size, replace=False)]
        for name, texts in sets.items():
            emb = embedder.embed(texts, cfg.embed_batch, progress=False)
            out.append({"seed": seed, "set": name, "size": len(texts),
                        "fred_to_test_users": float(fred_nonprivate(emb, test_emb))})
    return out
