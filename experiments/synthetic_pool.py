"""The public pool synthesised by the public LLM (`fedpriv.public.synthetic`, Wu et al. 2024;
issue 50's GPU item): how many public sentences it yields and how close it is to the private
users by FreD (Hou et al. 2023), beside the FreD table's candidates and the packaged pool.

Private users and FreD as `experiments.fred_table` at ``configs/fred_table.py:small`` (a random
half of the chitchat senders, <= 8 messages each; all-MiniLM-L6-v2; Algorithm 1 at (0.6, 1e-6)
per release, sample and user level), in the full 384-d embedding. Candidates, ``num_sentences``
each: fred_table's three (held-out chitchat senders, Wikipedia, Simpsons), the packaged public
pool (Wikipedia excerpt, Lee news, film quotes: the stand-in for Wang et al.'s C4), and the
synthetic pool's sentences (split and filtered as `load_public_text` does for any public text).

    python -m experiments.synthetic_pool [--pool experiments/results/synthetic_pool/smollm2_chat.txt.xz]
        [--workdir runs/synthetic_pool] [--seeds 5] [--num-sentences 3000]

Writes ``synthetic_pool.md`` / ``.csv`` / ``.json`` to ``--workdir`` (the committed copy of the
Markdown and JSON sits beside the pool).
"""
from __future__ import annotations

import hashlib
import json
import lzma
import os
import pathlib
import shutil
import sys

import numpy as np

from configs.fred_table import get_config
from experiments import common
from fedpriv import report
from fedpriv.argparsing import Parser
from fedpriv.data.paper_corpora import load_public_text
from fedpriv.data.public_pool import load_public_pool
from fedpriv.fred.compare import table_rows
from fedpriv.fred.embed import embed_all, sample_texts, table_datasets, table_declared_counts
from fedpriv.models import bert
from fedpriv.models.gguf import file_sha256

POOL = os.path.join(os.path.dirname(__file__), "results", "synthetic_pool", "smollm2_chat.txt.xz")
SYNTH = "SmolLM2 synthetic chat (this pool)"
PACKAGED = "packaged public pool (Wang stand-in)"


def pool_sentences(pool_xz: str, workdir: pathlib.Path) -> tuple[list[str], int]:
    """The pool's sentences as the public pool reads a ``.txt`` (`load_public_text`), and its
    message count."""
    txt = workdir / pathlib.Path(pool_xz).name.removesuffix(".xz")
    if not txt.exists():
        with lzma.open(pool_xz, "rb") as src, open(txt, "wb") as dst:
            shutil.copyfileobj(src, dst)
    with open(txt, encoding="utf-8") as f:
        messages = sum(1 for line in f if line.strip())
    return load_public_text(txt, progress=False).texts, messages


def run(pool_xz: str, workdir: str, seeds: int = 5, num_sentences: int | None = None) -> dict:
    """Size and FreD of the pool ``pool_xz`` (module doc); writes the tables to ``workdir``."""
    cfg = get_config("small")
    n = num_sentences or cfg.num_sentences
    work = pathlib.Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    sentences, messages = pool_sentences(pool_xz, work)
    private, candidates = table_datasets(n, cfg.max_per_user, cfg.data_seed)
    rng = np.random.default_rng([cfg.data_seed, 50])
    candidates[PACKAGED] = sample_texts(load_public_pool(progress=False).texts, n, rng)
    candidates[SYNTH] = sample_texts(sentences, n, rng)
    pool_sha = file_sha256(pool_xz)
    tag = hashlib.sha256(json.dumps([n, cfg.max_per_user, cfg.data_seed, pool_sha]).encode()).hexdigest()[:12]
    priv, cand, throughput = embed_all(bert.load_embedder(), private, candidates, cfg.embed_batch,
                                       work / f"embeddings-{tag}.npz")
    rows, releases = table_rows(list(priv.values()), cand, epsilon=cfg.epsilon, delta=cfg.delta,
                                clip=cfg.clip, seeds=seeds, pca_dims=0,
                                n_public=table_declared_counts(cfg.max_per_user))
    common.write_table(rows, str(work), "synthetic_pool")
    words = [len(s.split()) for s in sentences]
    stats = {"pool": os.path.relpath(pool_xz), "pool_sha256": pool_sha, "messages": messages,
             "sentences": len(sentences), "unique_sentences": len(set(sentences)),
             "median_words": float(np.median(words)), "private_senders": len(priv),
             "private_messages": int(sum(len(v) for v in priv.values())), "per_candidate": n,
             "seeds": seeds, "epsilon_per_release": cfg.epsilon, "delta_per_release": cfg.delta,
             "embedder_sentences_per_s": throughput}
    lines = ["# The synthetic public pool: size and FreD to the private users", "",
             f"Pool: `{stats['pool']}` (sha256 {pool_sha[:12]}): {messages:,} messages of the public "
             f"LLM -> {len(sentences):,} public sentences ({stats['unique_sentences']:,} distinct, median "
             f"{stats['median_words']:g} words) after the public pool's sentence filter (3-100 words, "
             "mostly letters).", "",
             f"FreD (Hou et al. 2023) in the full 384-d all-MiniLM-L6-v2 embedding: private = {len(priv)} "
             f"chitchat senders ({stats['private_messages']} messages), {n:,} sentences per candidate; "
             f"private FreD = Algorithm 1 at (eps {cfg.epsilon:g}, delta {cfg.delta:g}) per release, "
             f"mean ± std over {seeds} releases; NON-PRIVATE = exact statistics of the private users "
             "(not covered by the epsilon). Lower = closer to the private users.", "",
             "| unit of privacy | candidate | FreD private (mean ± std) | NON-PRIVATE FreD | rank (non-private) |",
             "|---|---|---|---|---|"]
    for unit in dict.fromkeys(r["unit"] for r in rows):
        rs = sorted((r for r in rows if r["unit"] == unit), key=lambda r: r["nonprivate/fred"])
        for i, r in enumerate(rs, 1):
            lines.append(f"| {unit} | {r['candidate']} | {r['fred_private_mean']:.4f} ± "
                         f"{r['fred_private_std']:.4f} | {r['nonprivate/fred']:.4f} | {i} |")
    lines += ["", f"Regenerate: `python -m experiments.synthetic_pool --pool {stats['pool']} "
              f"--seeds {seeds}`" + (f" --num-sentences {n}" if num_sentences else "")]
    md = "\n".join(lines) + "\n"
    (work / "synthetic_pool.md").write_text(md)
    out = {"stats": stats, "rows": rows, **report.git_state()}
    (work / "synthetic_pool.json").write_text(json.dumps(out, indent=1, default=float))
    print(md)
    return out


def main(argv=None) -> int:
    ap = Parser(prog="python -m experiments.synthetic_pool", description=__doc__.splitlines()[0])
    ap.add_argument("--pool", default=POOL, help="the pool (.txt.xz, one message per line)")
    ap.add_argument("--workdir", default="runs/synthetic_pool")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--num-sentences", type=int)
    a = ap.parse_args(argv)
    if not os.path.isfile(a.pool) or not a.pool.endswith(".txt.xz"):
        ap.error(f"--pool {a.pool!r} is not an existing .txt.xz file")
    if a.seeds < 1 or (a.num_sentences is not None and a.num_sentences < 2):
        ap.error("--seeds must be >= 1 and --num-sentences >= 2")
    run(a.pool, a.workdir, a.seeds, a.num_sentences)
    return 0


if __name__ == "__main__":
    sys.exit(main())
