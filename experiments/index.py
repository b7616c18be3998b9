"""The index of the papers' artefacts (``python -m experiments --list``): every table and figure
of the three papers (and the comparisons beyond them), the experiment module and config that
regenerate it, its scales, the outputs the results page shows and the claims it owns.

It is a leaf of ``experiments/``: the CLI (``experiments/__main__.py``), the results page
(``experiments/results.py``), the compact summaries (``experiments/compact.py``) and the
fidelity table (``fedpriv.recipes.fidelity``) read it; it imports none of them.

**A new artefact is one declaration.** Besides the built-in entries below, an experiment module
may declare its own entries as a module-level ``ARTEFACTS = (Artefact(...), ...)`` of literal
arguments; :func:`declared` finds them by reading ``experiments/*.py`` (without importing them),
so a new artefact is its config (``configs/<name>.py``: ``get_config`` and ``privacy_plan``) and
its experiment module (``main`` and that declaration), with no edit here or in the results page
(docs/extending.md, "An experiment / artefact").
"""
from __future__ import annotations

import ast
import dataclasses
import os

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclasses.dataclass(frozen=True)
class Artefact:
    name: str             # the key on the command line
    paper: str
    what: str
    module: str | None    # experiments.<module>; None: no module yet (named, so the gap is visible)
    config: str | None    # configs/<config>.py
    scales: tuple = ("smoke", "small", "paper")
    outputs: tuple = ()   # files in the run's workdir the results page shows (.md inlined, .png linked)
    claims: tuple = ()    # the results page shows the verdicts whose claim contains one of these
                          # (artefacts of one module share its verdicts.json); () = all
    depends: tuple = ()   # paths beyond fedpriv/, its config and module (and the configs /
                          # modules they import) whose changes make its results stale

    def shows(self, claim: str) -> bool:
        """Whether the results page shows a verdict on ``claim`` under this artefact (``claims``)."""
        return not self.claims or any(c in claim for c in self.claims)


BUILTIN = (
    Artefact("demo", "-", "the main job: DP-FTRL LSTM on chitchat (make demo)", "demo", "demo", ("smoke", "small"),
             ("summary.md", "learning_curve.png")),
    Artefact("wang-table1", "Wang et al. 2023", "DP-FTRL at eps 18.71 / 1.77, round 0 and round T, without "
             "pre-training (with pre-training: wang-table2's pretrain_lm row)", "privacy_utility", "privacy_utility",
             outputs=("table1.md", "privacy_utility.md"), claims=('(Table 1)',)),
    Artefact("wang-figure1", "Wang et al. 2023", "tokenizers (SentencePiece vs word vocabularies), next-token "
             "accuracy without / with OOV", "privacy_utility", "privacy_utility",
             outputs=("figure1.png", "privacy_utility.md"), claims=('Figure 1',)),
    Artefact("wang-table2", "Wang et al. 2023", "public pre-/mid-training, LLM distillation, distribution "
             "matching", "public_training", "public_training",
             outputs=("public_training.md", "public_training.png"), claims=('Table 2', 'Tables 1/2')),
    Artefact("wang-table3", "Wang et al. 2023", "with vs without log p_pub (rows of wang-table2's output)",
             "public_training", "public_training", outputs=("public_training.md",), claims=('Table 3',)),
    Artefact("wang-table4-5", "Wang et al. 2023", "timing T' of distribution matching / of mid-training "
             "(T' = 0, T/4, T/2, 3T/4, T)", "wang_ablations", "wang_ablations", outputs=("table4.md", "table5.md"),
             claims=('Table 4', 'Table 5')),
    Artefact("wang-figure2-4", "Wang et al. 2023", "accuracy after private FL vs distillation steps; vs top-k",
             "wang_ablations", "wang_ablations",
             outputs=("accuracy_vs_distill_steps.md", "accuracy_vs_distill_steps.png", "accuracy_vs_topk.md",
                      "accuracy_vs_topk.png"), claims=('Figure 2/4',)),
    Artefact("wang-figure3", "Wang et al. 2023", "perplexity of private vs public samples under a NON-PRIVATE "
             "oracle LM and the public LLM", "wang_figure3", "wang_figure3",
             outputs=("figure3_summary.md", "figure3.png")),
    Artefact("wang-appc-sweep", "Wang et al. 2023", "App. C grid: server lr x client lr x clip norm at one noise "
             "level, chosen on validation", "lm_sweep", "lm_sweep", outputs=("lm_sweep.md",)),
    Artefact("hou-table1", "Hou et al. 2023", "closer prefinetuning set -> lower test perplexity after DP "
             "FL-finetuning; private FreD keeps the order (FreD -> prefinetune -> DP FL-finetune, one ledger)",
             "fred_pipeline", "fred_pipeline", outputs=("fred_pipeline.md", "fred_pipeline.png")),
    Artefact("hou-table1-fred", "Hou et al. 2023", "Table 1's FreD columns in detail: both units of privacy, "
             "public PCA basis, mean ± std over releases", "fred_table", "fred_table", outputs=("fred_table.md",)),
    Artefact("hou-table2", "Hou et al. 2023", "test perplexity before / after DP FL-finetuning vs Y% of the "
             "prefinetuning set from the private distribution", "fred_mixtures", "fred_mixtures",
             outputs=("fred_mixtures.md",), claims=('(Table 2)',)),
    Artefact("hou-figure2", "Hou et al. 2023", "FreD vs Y% (non-private, private over trials); private FreD "
             "separating 99% from 100%", "fred_mixtures", "fred_mixtures", outputs=("fred_vs_y.png",),
             claims=('FreD',)),
    Artefact("koga-table1", "Koga et al. 2023", "8 schemes x 2 domain-adaptation datasets",
             "population_expansion", "population_expansion", outputs=("table.md", "table1.png")),
    Artefact("mf-comparison", "beyond the papers", "tree vs banded / BLT matrix-factorization DP-FTRL vs "
             "DP-FedAvg at equal epsilon (Choquette-Choo et al. 2023; McMahan et al. 2024)",
             "mf_comparison", "mf_comparison", outputs=("mf_comparison.md",)),
    Artefact("ddg-comparison", "beyond the papers", "distributed discrete Gaussian under simulated secure "
             "aggregation at 8/12/16/20 bits vs the central Gaussian at equal z (Kairouz et al. 2021)",
             "ddg_comparison", "ddg_comparison", outputs=("ddg_comparison.md",)),
    Artefact("pre-text", "beyond the papers", "PrE-Text (Hou et al. 2024): private synthetic text from "
             "the public LLM guided by DP votes vs on-device DP-FTRL at equal epsilon; synthetic "
             "pre-training + DP-FTRL", "pre_text", "pre_text",
             outputs=("pre_text.md", "rounds_to_match.png", "fred.md", "phases.md", "samples.md")),
    Artefact("llm-lora", "beyond the papers", "the public LLM as the on-device model: DP-FTRL LoRA of "
             "SmolLM2-135M vs the small LM trained with its help (public pre-training + distillation) vs the "
             "LLM zero-shot, at equal epsilon and equal upload, in bits per byte, with each arm's client cost",
             "llm_lora", "llm_lora", outputs=("llm_lora.md", "costs.md", "phases.md", "llm_lora.png")),
    Artefact("koga-iw-regime", "Koga et al. 2023", "IW/IWPT given a fair test: TV of the private target "
             "unigrams vs N_T, eps0, vocabulary, per-user bound; IW/IWPT vs baselines on a large target "
             "(chat_target), 24 seeds, + a no-signal control", "iw_regime", "iw_regime",
             outputs=("regime.md", "regime_vocab.png", "table.md", "control.md", "negative.md")),
    Artefact("koga-figure1", "Koga et al. 2023", "latency model: exact vs bounds vs Monte Carlo (Prop. 3.1)",
             "latency_figure", "latency_figure", outputs=("latency.md", "latency.png")),
)


def available(a: Artefact) -> bool:
    return a.module is not None and os.path.exists(os.path.join("configs", f"{a.config}.py"))


def listing() -> list[dict]:
    return [{"artefact": a.name, "paper": a.paper, "what": a.what,
             "command": (f"python -m experiments.{a.module} --config configs/{a.config}.py:<scale>"
                         if available(a) else "NOT YET IMPLEMENTED"),
             "scales": "/".join(a.scales) if available(a) else ""} for a in ARTEFACTS]




def declared(directory: str = HERE) -> tuple:
    """The ``Artefact`` entries experiment modules declare themselves (module docstring): every
    ``experiments/*.py`` whose module-level ``ARTEFACTS`` is a tuple/list of ``Artefact(...)``
    calls with literal arguments, in file order. A declaration that is not literal, or that
    repeats a name, is refused (``ValueError``: fail closed rather than drop an artefact)."""
    out = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".py") or name.startswith("_") or name == "index.py":
            continue
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "ARTEFACTS" for t in node.targets):
                out.extend(_literal_artefacts(node.value, name))
    return tuple(out)


def _literal_artefacts(value: ast.expr, where: str) -> list:
    if not isinstance(value, (ast.Tuple, ast.List)):
        raise ValueError(f"experiments/{where}: ARTEFACTS must be a tuple of Artefact(...)")
    arts = []
    for call in value.elts:
        if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "Artefact"):
            raise ValueError(f"experiments/{where}: ARTEFACTS must hold Artefact(...) calls")
        try:
            args = [ast.literal_eval(a) for a in call.args]
            kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        except ValueError:
            raise ValueError(f"experiments/{where}: an Artefact(...) of ARTEFACTS has a "
                             "non-literal argument") from None
        arts.append(Artefact(*args, **kwargs))
    return arts


def _index() -> tuple:
    arts = BUILTIN + declared()
    names = [a.name for a in arts]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"artefact name(s) declared twice: {', '.join(dup)}")
    return arts


ARTEFACTS = _index()
