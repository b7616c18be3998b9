"""PrE-Text's loop (Hou et al., ICML 2024, Alg. 1): the public LLM proposes synthetic messages,
clients' DP votes choose among them, the LLM varies the chosen ones, T times; then a one-shot
expansion of the final seeds.

The variation operator (chosen here, the paper's is a masked-LM span rewrite): **prefix
continuation** with the public chat LLM (SmolLM2-135M-Instruct, `fedpriv.models.generate`):
a child keeps the first ``f`` of its parent's tokens, ``f ~ U[prefix_min, prefix_max]``, and the
LLM continues it inside the parent's chat prompt until its end-of-turn token. Why: a causal LM
has no span-infilling objective, and continuation keeps the parent's opening (topic, register)
while resampling the rest -- the "small variation" Private Evolution needs; a paraphrase prompt
was the alternative, but a 135M-parameter model follows such instructions poorly. The initial
population is the LLM's answers to public instructions describing the domain (``instructions``;
public knowledge, as PrE-Text's initial prompts).

Per round (``EvolveSettings``): N samples are embedded with the public sentence embedder;
`release.release_round` returns the noisy vote histogram (the only private input); the top
``keep_fraction`` are kept (post-processing, `release.select_samples`) and, with elitism, carried
into the next population beside ``N - kept`` children drawn from the kept parents in proportion
to their positive noisy votes. The final expansion draws ``expansion`` children of the last
round's kept seeds the same way. Everything after each release is post-processing: no charge.

Keys: generation randomness (public) uses ``tagged_key(key, "pretext-generate", round)``,
never the votes' noise keys (``release.votes_noise_key``).
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Sequence

import jax
import numpy as np

from fedpriv.dp.keys import tagged_key
from fedpriv.models import generate as gen
from fedpriv.synth import release as R

__all__ = ["EvolveSettings", "Sample", "EvolveResult", "chat_prompt", "initial_samples",
           "variations", "allocate", "evolve", "GENERATE_TAG"]

GENERATE_TAG = "pretext-generate"
CHAT = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"


@dataclasses.dataclass(frozen=True)
class EvolveSettings:
    """Sizes and sampling settings of one PrE-Text run (module docstring)."""
    num_samples: int = 256          # N synthetic samples per round
    keep_fraction: float = 0.25     # top fraction of the noisy votes kept each round
    expansion: int = 2048           # final one-shot expansion: children of the last seeds
    max_new: int = 32               # LLM tokens per generation
    temperature: float = 1.0
    top_k: int = 50
    batch_size: int = 32
    prefix_min: float = 0.3         # a child keeps U[prefix_min, prefix_max] of its parent
    prefix_max: float = 0.7

    def __post_init__(self):
        if self.num_samples < 2 or self.expansion < 1 or self.max_new < 1 or self.batch_size < 1:
            raise ValueError(f"bad sizes in {self}")
        if not 0 < self.keep_fraction < 1:
            raise ValueError(f"keep_fraction must be in (0, 1), got {self.keep_fraction}")
        if not 0 <= self.prefix_min <= self.prefix_max < 1:
            raise ValueError(f"need 0 <= prefix_min <= prefix_max < 1, got {self.prefix_min}, "
                             f"{self.prefix_max}")


@dataclasses.dataclass(frozen=True)
class Sample:
    """A synthetic message: the index of its instruction and its teacher token ids (no stop)."""
    instruction: int
    ids: tuple


@dataclasses.dataclass
class EvolveResult:
    """``samples``: the released synthetic set (final seeds + their expansion); ``texts`` the
    same decoded; ``history`` one dict per round (votes stats, kept count); ``seconds`` wall
    time per phase (generate / embed / votes); ``generated_tokens``."""
    samples: list
    texts: list
    history: list
    seconds: dict
    generated_tokens: int
    initial_texts: list


def chat_prompt(teacher, instruction: str) -> list[int]:
    """Teacher ids of SmolLM2's chat template with one user turn, ready for the reply."""
    return teacher.encode(CHAT.format(instruction))


def _stops(teacher) -> tuple:
    ids = {teacher.eos_id}
    if teacher.tokenizer is not None:
        end = teacher.tokenizer.token_to_id("<|im_end|>")
        if end is not None:
            ids.add(int(end))
    return tuple(sorted(ids))


def _strip(ids, stops) -> tuple:
    return tuple(int(i) for i in ids if int(i) not in stops)


def _run(teacher, prompts, jobs, key, s: EvolveSettings, stats: dict) -> list[tuple]:
    """Continue ``jobs`` = [(instruction, head ids)] inside their chat prompts; returns the
    continuations (stop tokens removed). Jobs of one instruction share its prompt as a prefix
    prefilled once per batch (`generate(prefix=...)`); the prompt's last token starts each row."""
    outs: list = [None] * len(jobs)
    stops = _stops(teacher)
    for w in sorted({j[0] for j in jobs}):
        idx = [i for i, j in enumerate(jobs) if j[0] == w]
        rows = [list(prompts[w][-1:]) + list(jobs[i][1]) for i in idx]
        got = gen.generate(teacher, rows, jax.random.fold_in(key, w), max_new=s.max_new,
                           temperature=s.temperature, top_k=s.top_k, stop_ids=stops,
                           batch_size=s.batch_size, stats=stats, prefix=list(prompts[w][:-1]))
        for i, o in zip(idx, got):
            outs[i] = _strip(o, stops)
    return outs


def initial_samples(teacher, prompts: Sequence[Sequence[int]], n: int, key,
                    s: EvolveSettings, stats: dict) -> list[Sample]:
    """``n`` answers to the instruction prompts (round robin over them)."""
    jobs = [(i % len(prompts), ()) for i in range(n)]
    return [Sample(w, o) for (w, _), o in zip(jobs, _run(teacher, prompts, jobs, key, s, stats))]


def variations(teacher, prompts, parents: Sequence[Sample], counts: Sequence[int], key,
               s: EvolveSettings, stats: dict) -> list[Sample]:
    """``counts[i]`` children of ``parents[i]`` each: a random prefix of the parent continued
    by the LLM in the parent's chat prompt (module docstring)."""
    rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().astype(np.uint32))
    jobs = []
    for p, c in zip(parents, counts):
        for _ in range(int(c)):
            f = rng.uniform(s.prefix_min, s.prefix_max)
            jobs.append((p.instruction, tuple(p.ids[: int(math.floor(f * len(p.ids)))])))
    outs = _run(teacher, prompts, jobs, key, s, stats)
    return [Sample(w, h + o) for (w, h), o in zip(jobs, outs)]


def allocate(noisy_votes, kept: np.ndarray, n: int) -> np.ndarray:
    """Children per kept sample: ``n`` split in proportion to the kept samples' positive noisy
    votes (largest remainders; uniform if none is positive). ``[len(kept)]`` ints summing to n."""
    w = np.maximum(np.asarray(noisy_votes, np.float64)[kept], 0.0)
    w = np.full(len(kept), 1.0) if w.sum() <= 0 else w
    raw = n * w / w.sum()
    out = np.floor(raw).astype(int)
    out[np.argsort(-(raw - out), kind="stable")[: n - out.sum()]] += 1
    return out


def evolve(teacher, embed: Callable[[list], np.ndarray], plan, clients, prompts, s: EvolveSettings,
           key, *, log=print) -> EvolveResult:
    """Run ``plan.rounds`` vote rounds and the final expansion.

    Args:
      teacher: the public LLM (`fedpriv.models.llama.Teacher`); embed: ``texts -> [n, d]`` unit
        rows (the public embedder); plan: `release.plan_votes`'s plan (the ledger was charged);
      clients: ``clients[i]`` / ``clients(i)`` -> ``[n_i, d]`` embeddings of user i's messages;
      prompts: the instructions' chat prompts (teacher ids); key: root key of the generations.
    """
    secs = {"generate": 0.0, "embed": 0.0, "votes": 0.0}
    stats: dict = {}
    t0 = time.perf_counter()
    pop = initial_samples(teacher, prompts, s.num_samples, tagged_key(key, GENERATE_TAG, "init"),
                          s, stats)
    secs["generate"] += time.perf_counter() - t0
    initial = [teacher.decode(p.ids) for p in pop]
    history, kept_samples = [], pop
    for t in range(plan.rounds):
        texts = [teacher.decode(p.ids) or "." for p in pop]
        t0 = time.perf_counter()
        emb = embed(texts)
        secs["embed"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        rel = R.release_round(plan, t, clients, emb)
        secs["votes"] += time.perf_counter() - t0
        kept = R.select_samples(rel.noisy_votes, keep_fraction=s.keep_fraction)
        v = rel.noisy_votes
        history.append({"round": t, "cohort": rel.num_clients, "noise_std": rel.noise_std,
                        "votes_max": float(v.max()), "votes_mean_kept": float(v[kept].mean()),
                        "votes_mean_rest": float(np.delete(v, kept).mean()) if len(kept) < len(v) else None,
                        "kept": int(len(kept))})
        log(f"PrE-Text round {t + 1}/{plan.rounds}: {rel.num_clients} voters, noisy votes max "
            f"{v.max():.2f}, kept {len(kept)} (mean vote {v[kept].mean():.2f})")
        kept_samples = [pop[i] for i in kept]
        n_children = s.expansion if t == plan.rounds - 1 else s.num_samples - len(kept)
        t0 = time.perf_counter()
        children = variations(teacher, prompts, kept_samples, allocate(v, kept, n_children),
                              tagged_key(key, GENERATE_TAG, t), s, stats)
        secs["generate"] += time.perf_counter() - t0
        pop = kept_samples + children
    final = [p for p in pop if p.ids]
    return EvolveResult(samples=final, texts=[teacher.decode(p.ids) for p in final],
                        history=history, seconds=secs, generated_tokens=int(stats.get("tokens", 0)),
                        initial_texts=initial)
