"""A public pool synthesised by the public LLM from public instructions (Wu et al. 2024, "Prompt
Public Large Language Models to Synthesize Data for Private On-device Applications").

The public LLM (the packaged SmolLM2-135M-Instruct, `fedpriv.models.gguf`) answers public
instructions that describe the private domain (casual chat messages, as chitchat's users write;
`DEFAULT_INSTRUCTIONS`), one message per generation (`fedpriv.synth.evolve.initial_samples`: the
chat template, the reply up to the end-of-turn token). It reads no private data, so the pool costs
no privacy: it is public data, like C4 in Wang et al. 2023, and can stand in for
``public_pool_path`` (one message per line of a ``.txt`` file; `fedpriv.data.paper_corpora.
load_public_text` splits and filters the sentences).

Generation runs in chunks of ``chunk`` messages, chunk ``c`` from
``tagged_key(seed, "public-synth", c)``: a rerun continues at the first unfinished chunk and a
finished chunk is never regenerated, so a pool interrupted (``deadline_s``, a killed job) and
resumed is the pool of one uninterrupted run. Beside ``out`` a JSON sidecar records the settings,
the teacher's sha256, the chunks done, the byte length they fill, tokens and seconds.

    python -m fedpriv.public.synthetic --out POOL.txt --messages 120000 [--seed 0]
        [--chunk 8192] [--batch-size 512] [--max-new 32] [--deadline-s S] [--teacher GGUF]
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Sequence

import jax

from fedpriv.argparsing import Parser, one_line
from fedpriv.dp.keys import tagged_key
from fedpriv.models.gguf import cached_teacher
from fedpriv.synth import evolve as E

__all__ = ["DEFAULT_INSTRUCTIONS", "SynthSettings", "synthesize", "main"]

TAG = "public-synth"

# public descriptions of the private domain (chitchat: casual conversations between strangers);
# the first six are PrE-Text's initial prompts (configs/pre_text.py)
DEFAULT_INSTRUCTIONS = (
    "Write a short, casual text message to a friend.",
    "Reply to a friend who asked how your weekend was.",
    "Ask a friend a question about their plans.",
    "Write one line of small talk for a chat with someone you just met.",
    "Write a short chat message about a hobby you like.",
    "Write a short, friendly reply in a chat conversation.",
    "Write a short chat message about your job or your studies.",
    "Tell someone you just met in a chat where you grew up, in one or two sentences.",
    "Write a short chat message about a movie or a TV show you watched.",
    "Write a short chat message about music you like.",
    "Write a short chat message about food or cooking.",
    "Write a short chat message about travel or a place you visited.",
    "Write a short chat message about your pet or an animal you like.",
    "Write a short chat message about sports or exercise.",
    "Ask someone you just met in a chat a friendly question about themselves.",
    "Write a short chat message about the weather where you live.",
)


@dataclasses.dataclass(frozen=True)
class SynthSettings:
    """What the pool is: ``messages`` generations, round robin over ``instructions``, sampled at
    ``temperature`` / ``top_k``, at most ``max_new`` teacher tokens each, in chunks of ``chunk``
    (the unit of resumption), from ``seed``. ``batch_size`` is the generation batch (speed only:
    changing it does not change a finished chunk, so it is not compared on resume)."""
    messages: int = 120_000
    seed: int = 0
    chunk: int = 8192
    max_new: int = 40
    temperature: float = 1.0
    top_k: int = 50
    batch_size: int = 512
    instructions: tuple = DEFAULT_INSTRUCTIONS

    def __post_init__(self):
        for name in ("messages", "chunk", "max_new", "batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0):
            raise ValueError(f"temperature must be > 0, got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0: no top-k), got {self.top_k!r}")
        if not self.instructions or not all(isinstance(s, str) and s.strip() for s in self.instructions):
            raise ValueError("instructions: at least one non-empty public instruction")

    def identity(self) -> dict:
        """The fields that define the pool's content (a resumed run must match them)."""
        d = dataclasses.asdict(self)
        d.pop("batch_size")
        d.pop("messages")  # a pool may be extended: chunks are defined independently of it
        d["instructions"] = list(self.instructions)
        return d


def _clean(text: str) -> str:
    """One line: whitespace runs (newlines too) become one space."""
    return " ".join(text.split())


def _meta_path(out: str) -> str:
    return out + ".json"


def _resume_state(out: str, settings: SynthSettings, fingerprint: str) -> tuple[int, int, dict]:
    """(chunks done, their byte length, the sidecar's counters) of a previous run at ``out``; a
    pool written with other settings or by another teacher is refused, never overwritten."""
    meta_file = _meta_path(out)
    if not os.path.exists(out):
        if os.path.exists(meta_file):
            raise ValueError(f"{meta_file} exists but its pool {out} does not: remove the sidecar or "
                             "restore the pool")
        return 0, 0, {}
    if not os.path.exists(meta_file):
        raise ValueError(f"{out} exists without its sidecar {meta_file}: not a pool of this tool "
                         "(choose another --out)")
    with open(meta_file) as f:
        meta = json.load(f)
    if meta.get("settings") != settings.identity():
        raise ValueError(f"{out} was generated with other settings ({meta.get('settings')}); "
                         "resume with the same ones or choose another --out")
    if meta.get("teacher_sha256") != fingerprint:
        raise ValueError(f"{out} was generated by another teacher ({meta.get('teacher_sha256')})")
    done, prev = int(meta["chunks_done"]), int(meta["messages_requested"])
    held = min(done * settings.chunk, prev)  # generations in the finished chunks
    if settings.messages < held:
        raise ValueError(f"{out} already holds the generations of {held} messages, more than "
                         f"messages={settings.messages}: ask for at least {held} or choose another --out")
    if done * settings.chunk > prev and settings.messages != prev:
        raise ValueError(f"{out}'s last chunk holds {prev - (done - 1) * settings.chunk} of {settings.chunk} "
                         f"generations (messages={prev}): it can only be extended from a whole chunk; "
                         "choose another --out")
    size = os.path.getsize(out)
    if size < meta["bytes"]:
        raise ValueError(f"{out} is shorter ({size} bytes) than its sidecar records ({meta['bytes']})")
    return done, int(meta["bytes"]), meta


def synthesize(teacher, settings: SynthSettings, out: str, *, deadline_s: float | None = None,
               progress: bool = True, log=print) -> dict:
    """Generate (or continue) the pool ``out`` (``.txt``, one message per line); returns the
    sidecar's dict. Stops after the last chunk, or at the first chunk boundary past
    ``deadline_s`` seconds (the sidecar then says ``complete: false``; rerun to continue).

    Each chunk appends its non-empty messages (an empty generation, the end-of-turn token first,
    is counted in ``empty``; a message cut off at ``max_new`` tokens loses its unfinished last
    sentence where it has an earlier sentence end, counted in ``truncated``) and then rewrites
    the sidecar: a crash mid-chunk leaves bytes past the sidecar's ``bytes``, truncated on
    resume.
    """
    done, nbytes, meta = _resume_state(out, settings, teacher.fingerprint)
    n_chunks = -(-settings.messages // settings.chunk)
    counters = {k: meta.get(k, 0) for k in ("written", "empty", "truncated", "tokens")}
    seconds = float(meta.get("seconds", 0.0))
    prompts = [E.chat_prompt(teacher, s) for s in settings.instructions]
    evolve_settings = E.EvolveSettings(max_new=settings.max_new, temperature=float(settings.temperature),
                                       top_k=settings.top_k, batch_size=settings.batch_size)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "ab") as f:
        f.truncate(nbytes)
    t0 = time.perf_counter()

    def write_meta(complete: bool) -> dict:
        m = {"settings": settings.identity(), "messages_requested": settings.messages,
             "teacher_sha256": teacher.fingerprint, "teacher_file": os.path.basename(teacher.path or ""),
             "chunks_done": done, "chunks": n_chunks, "bytes": nbytes, **counters,
             "seconds": seconds, "tokens_per_s": counters["tokens"] / seconds if seconds else None,
             "complete": complete, "reference": "Wu et al. 2024 (public LLM synthesises public data)",
             "jax": jax.__version__, "devices": [str(d) for d in jax.devices()]}
        tmp = _meta_path(out) + ".tmp"
        with open(tmp, "w") as g:
            json.dump(m, g, indent=1)
        os.replace(tmp, _meta_path(out))
        return m

    m = write_meta(done >= n_chunks)
    while done < n_chunks:
        if deadline_s is not None and time.perf_counter() - t0 > deadline_s:
            log(f"deadline: {done} of {n_chunks} chunks done; rerun to continue")
            break
        n = min(settings.chunk, settings.messages - done * settings.chunk)
        stats: dict = {}
        c0 = time.perf_counter()
        # message i of the whole pool answers instruction i mod W (initial_samples starts its
        # round robin at its first prompt: rotate the prompts to this chunk's first message)
        r = (done * settings.chunk) % len(prompts)
        samples = E.initial_samples(teacher, prompts[r:] + prompts[:r], n,
                                    tagged_key(settings.seed, TAG, done), evolve_settings, stats)
        lines = []
        for s in samples:
            text = _clean(teacher.decode(s.ids))
            if len(s.ids) >= settings.max_new:  # cut off by max_new: drop its unfinished sentence
                counters["truncated"] += 1
                end = max(text.rfind(c) for c in ".!?")
                text = text[:end + 1] if end > 0 else text
            lines.append(text)
        kept = [ln for ln in lines if ln]
        blob = "".join(ln + "\n" for ln in kept).encode("utf-8")
        with open(out, "ab") as f:
            f.write(blob)
        nbytes += len(blob)
        counters["written"] += len(kept)
        counters["empty"] += len(lines) - len(kept)
        counters["tokens"] += int(stats.get("tokens", 0))
        seconds += time.perf_counter() - c0
        done += 1
        m = write_meta(done >= n_chunks)
        if progress:
            log(f"chunk {done}/{n_chunks}: {counters['written']:,} messages, "
                f"{m['tokens_per_s'] or 0:,.0f} tokens/s")
    return m


def main(argv: Sequence[str] | None = None) -> int:
    ap = Parser(prog="python -m fedpriv.public.synthetic", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the pool (.txt, one message per line)")
    ap.add_argument("--messages", type=int, default=SynthSettings.messages)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=SynthSettings.chunk)
    ap.add_argument("--batch-size", type=int, default=SynthSettings.batch_size)
    ap.add_argument("--max-new", type=int, default=SynthSettings.max_new)
    ap.add_argument("--temperature", type=float, default=SynthSettings.temperature)
    ap.add_argument("--top-k", type=int, default=SynthSettings.top_k)
    ap.add_argument("--instructions", help="a file of public instructions, one per line "
                    "(default: DEFAULT_INSTRUCTIONS)")
    ap.add_argument("--deadline-s", type=float, help="stop at the first chunk boundary after this")
    ap.add_argument("--teacher", help="the public LLM's GGUF (default: the packaged SmolLM2)")
    a = ap.parse_args(argv)
    if not a.out.endswith(".txt"):
        ap.error(f"--out must be a .txt file (load_public_text reads .txt), got {a.out!r}")
    if a.deadline_s is not None and not a.deadline_s > 0:
        ap.error(f"--deadline-s must be > 0, got {a.deadline_s}")
    try:
        instructions = DEFAULT_INSTRUCTIONS
        if a.instructions:
            with open(a.instructions, encoding="utf-8") as f:
                instructions = tuple(ln.strip() for ln in f if ln.strip())
        settings = SynthSettings(messages=a.messages, seed=a.seed, chunk=a.chunk, max_new=a.max_new,
                                 temperature=a.temperature, top_k=a.top_k, batch_size=a.batch_size,
                                 instructions=instructions)
    except (OSError, ValueError) as e:
        ap.error(str(e))
    try:
        teacher = cached_teacher(a.teacher)
        m = synthesize(teacher, settings, a.out, deadline_s=a.deadline_s)
    except (OSError, ValueError) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    print(json.dumps({k: m[k] for k in ("written", "empty", "tokens", "seconds", "tokens_per_s",
                                        "chunks_done", "chunks", "complete")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
