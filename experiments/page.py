"""What the results page says beyond the artefacts' own outputs, and the page's own checks.

- :data:`CENTRAL`: each paper's central claims; :func:`central_screen` renders them at the top of
  the page (the paper's numbers, ours with the 90 % interval, the verdict and the verdict after
  Holm), so a reader sees what reproduces without reading the artefacts.
- :func:`families` / :func:`holm_statuses` / :func:`counts`: one Holm family (family-wise 10 %)
  per paper for the papers' claims and one per paper for the project's checks
  (:func:`fedpriv.verdicts.holm`); the counts separate paper claims from project checks and count
  fragile verdicts apart from decided ones (:func:`fedpriv.verdicts.tally`).
- :func:`privacy_line`: the epsilons of the published run of an artefact, each SIMULATED (with the
  population it assumes) or SPENT on our users, from the privacy plan of its recorded config
  (``experiments/results/privacy.json``, written by ``python -m experiments.fidelity``).
- :func:`correct`: the published outputs' own text, corrected where it misleads (a reference to a
  file the repository does not hold, an undeclared simulated epsilon, a pointer to another
  pipeline); every correction is listed under the output it changes.
- :func:`check_page`: the problems of a rendered page (a machine path, a dangling file reference,
  an undeclared simulated epsilon, a ``Regenerate:`` line that is not the published run's
  recorded command); ``tests/experiments/test_results_page.py`` renders the committed page and
  requires none.
"""
from __future__ import annotations

import json
import os
import re

from fedpriv import verdicts as V

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRIVACY_FILE = os.path.join(ROOT, "experiments", "results", "privacy.json")
PAPERS = ("Wang et al. 2023", "Hou et al. 2023", "Koga et al. 2023")

#: per paper: (a substring of the claim, the short label on the screen, the paper's number where
#: the verdict does not carry it)
CENTRAL = {
    "Wang et al. 2023": [
        ("[sentencepiece] a larger epsilon gives higher accuracy (Table 1)", "eps 18.71 beats eps 1.77 (Table 1)",
         "24.45 vs 20.48"),
        ("public pre-training gives reasonable zero-shot accuracy", "zero-shot accuracy after pre-training "
         "(Table 1, round 0)", "16.94 vs 0.00"),
        ("DP-FTRL eps~18.7: SentencePiece beats word:2000 in next-token accuracy (Figure 1)",
         "public SentencePiece beats a word vocabulary (Figure 1, eps 18.7)", "Figure 1 (no values in the text)"),
        ("[eps 1.77] public pre-training beats no public training", "pre-training beats none (LSTM, eps 1.77)", ""),
        ("[eps 18.71] public pre-training beats no public training", "pre-training beats none (LSTM, eps 18.71)", ""),
        ("[eps 1.77] distillation pre-training improves on no public training by more than 7 points",
         "distillation: more than 7 points over none (eps 1.77)", "28.68 vs 20.68"),
        ("[eps 1.77] pre-training with distillation on 1% of the public data is at least as good",
         "distillation on 1 % >= pre-training on 100 % (eps 1.77)", "28.68 vs 28.01"),
        ("[eps 1.77] distribution matching on 0.08% performs as well as distillation on 1%",
         "DM on 0.08 % as good as distillation on 1 % (eps 1.77)", "28.01 vs 28.68"),
        ("[eps 1.77] mid-training (T'=T/2) beats pre-training (T'=0)", "mid-training beats pre-training "
         "(eps 1.77)", ""),
        ("[eps 1.77] distribution matching beats a random public subset (Table 2)",
         "distribution matching beats a random subset (eps 1.77)", ""),
        ("[eps 1.77] distribution matching on a small q", "DM on a small q comparable to whole-pool "
         "pre-training (eps 1.77)", ""),
        ("[eps 1.77] matching with log p_pub + log p_priv beats log p_priv alone", "log p_pub helps matching "
         "(Table 3, eps 1.77)", ""),
        ("T'=T/2 is the best T' (mid_dm, eps~1.77; Table 4)", "T' = T/2 is the best T' (Table 4, eps 1.77)",
         "27.73 vs 25.41-27.08"),
        ("private samples have lower median PPL under the oracle", "private samples: lower PPL under the "
         "oracle (Figure 3)", "Figure 3"),
    ],
    "Hou et al. 2023": [
        ("Hou et al. Table 1: private FreD ranks the candidates", "private FreD picks the closer candidate "
         "(Table 1)", "826.82 vs 954.25"),
        ("Hou et al. Table 1: the candidate closer by non-private FreD gives lower test perplexity",
         "the closer candidate gives lower perplexity (Table 1)", "65.90 vs 67.33"),
        ("test perplexity after DP FL-finetuning decreases with Y (Table 2)", "perplexity falls with Y "
         "(Table 2, after FL)", "52.77 -> 36.33"),
        ("test perplexity after FL-finetuning is lower at Y=100 than at Y=99", "Y = 100 beats Y = 99 "
         "(Table 2, after FL)", ""),
        ("private FreD (eps=0.6, delta=2e-06 per release) decreases monotonically with Y",
         "private FreD falls with Y (Figure 2)", "Figure 2"),
        ("private FreD separates 99% from 100%", "private FreD separates 99 % from 100 % (Figure 2)", "Figure 2"),
    ],
    "Koga et al. 2023": [
        # Table 1 in the regime where the private unigrams carry signal (chat_target, ~680 target
        # users: koga-iw-regime); the two small-target analogues below are the negative case
        ("[chat_target] a cohort of C beats alpha*C", "cohort C beats alpha C (chat_target: IW has signal)", ""),
        ("[chat_target] IW outperforms the S u T baseline", "IW beats S u T (chat_target)", ""),
        ("[chat_target] PT outperforms the S u T baseline", "PT beats S u T (chat_target)", ""),
        ("[chat_target] IWPT is the best scheme", "IWPT is the best scheme (chat_target)", ""),
        ("[topics] a cohort of C beats alpha*C", "cohort C beats alpha C (SubReddits analogue)", ""),
        ("[spoken_vs_typed] a cohort of C beats alpha*C", "cohort C beats alpha C (CV & Reddits analogue)", ""),
        ("[topics] IW outperforms the S u T baseline", "IW beats S u T (SubReddits analogue)", ""),
        ("[spoken_vs_typed] IW outperforms the S u T baseline", "IW beats S u T (CV & Reddits analogue)", ""),
        ("[topics] PT outperforms the S u T baseline", "PT beats S u T (SubReddits analogue)", ""),
        ("[spoken_vs_typed] PT outperforms the S u T baseline", "PT beats S u T (CV & Reddits analogue)", ""),
        ("[topics] IWPT is the best scheme", "IWPT is the best scheme (SubReddits analogue)", "347.78"),
        ("[spoken_vs_typed] IWPT is the best scheme", "IWPT is the best scheme (CV & Reddits analogue)", "203.14"),
        ("[topics] IWPT's perplexity is 13% lower", "IWPT 13 % below S u T", "347.78 vs 400.90"),
        ("[spoken_vs_typed] IWPT's perplexity is 30% lower", "IWPT 30 % below S u T", "203.14 vs 302.64"),
        ("a larger population lowers the latency", "latency falls with the population (Figure 1)", "Figure 1"),
    ],
}


def is_central(paper: str, claim: str) -> bool:
    return any(p in claim for p, _, _ in CENTRAL.get(paper, ()))


# ----------------------------------------------------------------------------------------------
# families, Holm, counts
# ----------------------------------------------------------------------------------------------

def families(items) -> dict:
    """``{(paper, source): [(artefact name, verdict)]}`` over the page's items (results.collect);
    a verdict shown under two artefacts (one run's verdicts) counts once."""
    out, seen = {}, set()
    for item in items:
        a = item["artefact"]
        for v in item["verdicts"]:
            key = (a.module, v.claim)
            if key in seen:
                continue
            seen.add(key)
            out.setdefault((a.paper, v.source), []).append((a.name, v))
    return out


def holm_statuses(items) -> dict:
    """``{(module, claim): status after Holm}``: one family per (paper, source)."""
    out = {}
    for (paper, source), members in families(items).items():
        statuses = V.holm([v for _, v in members])
        for (name, v), s in zip(members, statuses):
            out[(_module(items, name), v.claim)] = s
    return out


def _module(items, name):
    return next(i["artefact"].module for i in items if i["artefact"].name == name)


def counts(items) -> dict:
    """Per paper (and "all papers"): :func:`fedpriv.verdicts.tally` of its papers' claims
    (``"paper"``) and of the project's checks (``"project"``), each with its own Holm family."""
    fams = families(items)
    out = {}
    for paper in sorted({p for p, _ in fams}):
        out[paper] = {src: V.tally([v for _, v in fams.get((paper, src), [])]) for src in V.SOURCES}
    out["all papers (their claims)"] = _summed([out[p]["paper"] for p in PAPERS if p in out])
    return out


def _summed(tallies: list) -> dict:
    """The per-paper tallies added up (Holm stays per paper: each paper is its own family)."""
    def add(a, b):
        if isinstance(a, dict):
            return {k: add(a.get(k, 0 if not isinstance(b.get(k), dict) else {}), b[k]) for k in {*a, *b}
                    if k in b} | {k: a[k] for k in a if k not in b}
        return a + b
    out: dict = {}
    for t in tallies:
        out = add(out, t) if out else t
    return out or V.tally([])


def _short_counts(t: dict) -> str:
    by = t["by_status"]
    parts = [f"{by[s]} {s}" for s in V.STATUSES if by.get(s)]
    return (f"{t['total']} verdicts: " + ", ".join(parts) + f"; decided {t['decided']} of {t['testable']} "
            f"testable ({t['fragile']} fragile, not counted); after Holm (family-wise 10 %) decided "
            f"{t['holm']['decided']}")


# ----------------------------------------------------------------------------------------------
# the top screen
# ----------------------------------------------------------------------------------------------

def _num(x):
    return "" if x is None else f"{x:.4g}"


def _ours(v: V.Verdict) -> str:
    if v.gap is not None and v.ci is not None and len(v.sides) == 2:
        a, b = v.sides
        return (f"{_num(a['mean'])} vs {_num(b['mean'])}: gap {v.gap:+.3g} [{v.ci[0]:+.3g}, {v.ci[1]:+.3g}], "
                f"n={a['n']}")
    if v.parts:
        worst = [p for p in v.parts if p.status == v.status] or list(v.parts)
        p = worst[0]
        return f"{len(v.parts)} comparisons; e.g. {p.claim}: " + (
            f"gap {p.gap:+.3g} [{p.ci[0]:+.3g}, {p.ci[1]:+.3g}]" if p.ci else p.status)
    return (v.measured or "")[:120]


def central_screen(items, holm: dict) -> list[str]:
    """The page's first screen: per paper its central claims (:data:`CENTRAL`) with the paper's
    numbers, ours, the verdict (fragile marked) and the verdict after Holm; then the counts. A claim
    that one artefact cannot test (or has not run) and another tests shows the tested verdict."""
    by_paper = {}
    for item in items:
        for v in item["verdicts"]:
            by_paper.setdefault(item["artefact"].paper, []).append((item, v))
    lines = ["## The papers' central claims at a glance", "",
             "Each paper's central claims: the paper's numbers (A vs B), ours (means, the gap A - B with its "
             "90 % interval, seeds), the verdict of `fedpriv.verdicts` and the verdict after Holm's adjustment "
             "over all of that paper's claims (family-wise 10 %). *fragile*: an interval edge within 0.1 "
             "(or 10 % of the gap) of its boundary, not counted as decided. Details in each artefact's section.",
             ""]
    for paper, entries in CENTRAL.items():
        lines += [f"### {paper}", "", "| claim | the paper | ours | verdict | after Holm | artefact |",
                  "|---|---|---|---|---|---|"]
        for pattern, label, fallback in entries:
            hits = [(i, v) for i, v in by_paper.get(paper, []) if pattern in v.claim]
            # a claim untestable (or not run) in one artefact and tested in another: the tested one
            hit = next((h for h in hits if h[1].status not in (V.NOT_TESTABLE, V.NOT_RUN)), hits[0] if hits else None)
            if hit is None:
                lines.append(f"| {label} | {fallback} | (no verdict recorded) | - | - | - |")
                continue
            item, v = hit
            pv = (f"{v.paper_values[0]:g} vs {v.paper_values[1]:g}" if v.paper_values else fallback) or "-"
            if v.paper_effect is not None:
                pv += f" (at our level: {v.paper_effect:+.3g})"
            status = f"**{v.status}**" + (" *fragile*" if v.fragile else "") + \
                (" (project check)" if v.source == "project" else "")
            h = holm.get((item["artefact"].module, v.claim), v.status)
            lines.append(f"| {label} | {pv} | {_cell(_ours(v))} | {status} | {h} | {item['artefact'].name} |")
        lines.append("")
    lines += ["### Counts", "", "The papers' claims and the project's own checks (substitute contrasts, "
              "diagnostics, work beyond the papers, claims the paper's own tables contradict) are counted apart; "
              "each is one Holm family per paper.", "",
              "| paper | the papers' claims | the project's checks |", "|---|---|---|"]
    cs = counts(items)
    def cell(t):
        return _short_counts(t) if t["total"] else "-"
    for paper in (*PAPERS, "beyond the papers", "-"):
        if paper in cs:
            lines.append(f"| {paper} | {cell(cs[paper]['paper'])} | {cell(cs[paper]['project'])} |")
    if "all papers (their claims)" in cs:
        lines.append(f"| all three papers (Holm per paper, summed) | {cell(cs['all papers (their claims)'])} | |")
    return lines + [""]


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


# ----------------------------------------------------------------------------------------------
# privacy declarations, substitutions, corrections
# ----------------------------------------------------------------------------------------------

def read_privacy(path: str = PRIVACY_FILE) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def privacy_line(module: str, spec: str | None, declarations: dict) -> str:
    """The published run's epsilons, each SIMULATED (naming the population) or SPENT on our users
    (``fedpriv.recipes.fidelity.declaration_text`` of its plan); says so when the declaration
    is missing or was made for another config."""
    from fedpriv.recipes.fidelity import declaration_text
    d = declarations.get(module)
    if d is None or spec is None:
        return ("Privacy: no declaration recorded for this run (`python -m experiments.fidelity` accounts the "
                "published configs).")
    if d.get("config") != spec:
        return (f"Privacy: the declaration on record is for `{d.get('config')}`, not this run's config: "
                "rerun `python -m experiments.fidelity`.")
    if "refused" in d:
        return f"Privacy: the plan of this config is refused: {d['refused']}"
    return ("Privacy (from the privacy plan of this run's config; unit: user unless the substitutions say "
            "otherwise): epsilon " + declaration_text(d["runs"]) + ".")


def simulated(module: str, declarations: dict) -> bool:
    d = declarations.get(module) or {}
    return any(r.get("simulated") for r in d.get("runs", []))


#: (module, the published text, its correction, why) -- applied to the inlined outputs
CORRECTIONS = (
    (None, re.compile(r"(epsilon per run|epsilon_executed_run|executed-run epsilons) in runs\.csv"),
     r"\1 in each run's own summary (the run's workdir; not committed)",
     "the per-run table it named is a file of the run's workdir, not of the repository"),
    ("privacy_utility", "ours: see privacy_utility.md", "ours: see the privacy-utility table below",
     "the table's pointer named a file of the run's workdir; that table is inlined below"),
    ("privacy_utility", "- with pre-training: wang-table2's pretrain_lm row (experiments.public_training)",
     "- with pre-training: wang-table2's pretrain_lm row (experiments.public_training) -- ANOTHER PIPELINE "
     "(teacher-BPE vocabulary of 3,000 ids, ~20 % UNK targets): compare it with wang-table2's own no-public "
     "row, not with this table",
     "wang-table2's no-public-training row is ~10 points below this table's"),
    ("fred_mixtures", re.compile(r"calibrated so FreD \+ FL fit epsilon ([0-9.]+) \(delta ([0-9e.-]+)\);"),
     r"calibrated so FreD + FL fit epsilon \1 (delta \2) of a SIMULATED population (the noise of a cohort of "
     r"100 while training 16; the epsilon SPENT on our users is in the Privacy line above);",
     "the run charges a simulated population (noise_cohort_size) and spends far more on our users"),
    ("lm_sweep", "each point one run at target epsilon 18.7, delta=1e-06 (user-level)",
     "each point one run at target epsilon 18.7 of a SIMULATED population (the noise of a cohort of 100 while "
     "training 16; the epsilon SPENT on our users is in the Privacy line above), delta=1e-06 (user-level)",
     "the grid's epsilon is a simulated population's, not what the runs spend"),
)
#: the artefact descriptions (the index's ``what``), corrected the same way
WHAT_CORRECTIONS = {
    "wang-table1": ("(with pre-training: wang-table2's pretrain_lm row)",
                    "(with pre-training: wang-table2's pretrain_lm row, another pipeline whose own no-public "
                    "row is its baseline)"),
}


def correct(module: str, text: str) -> tuple[str, list[str]]:
    """``(text corrected, [what was corrected and why])`` for an inlined output of ``module``."""
    notes = []
    for mod, old, new, why in CORRECTIONS:
        if mod is not None and mod != module:
            continue
        if isinstance(old, re.Pattern):
            text, n = old.subn(new, text)
        else:
            n = text.count(old)
            text = text.replace(old, new)
        if n:
            notes.append(why)
    return text, notes


def unigram_addendum(module: str, verdicts) -> list[str]:
    """Koga Table 1: the unigram baseline as rows (its test perplexity on T, recorded by the run as
    the verdicts' trivial baseline), for a published table that lacks them."""
    if module not in ("population_expansion",):
        return []
    seen = {}
    for v in verdicts:
        m = re.match(r"\[(\w+)\]", v.claim)
        for s in v.sides:
            if m and s.get("trivial") is not None:
                seen.setdefault(m.group(1), s["trivial"])
    if not seen:
        return []
    return (["| dataset | scheme | test PPL on T |", "|---|---|---|"]
            + [f"| {d} | unigram (trivial baseline, NON-PRIVATE reference) | {t:.1f} |" for d, t in seen.items()])


# ----------------------------------------------------------------------------------------------
# the page's own checks
# ----------------------------------------------------------------------------------------------

MACHINE_PATH = re.compile(r"(?<![\w.])(/(?:tmp|home|work|root|Users|var|mnt|opt|private)/[\w./-]+)")
FILE_REF = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.(?:csv|md|json|png|py|txt|gguf|safetensors))\b")


def _exists(ref: str, root: str) -> bool:
    for base in (root, os.path.join(root, "experiments"), os.path.join(root, "docs")):
        if os.path.exists(os.path.join(base, ref)):
            return True
    name = os.path.basename(ref)
    return any(name in files for _, _, files in os.walk(os.path.join(root, "experiments", "results")))


def check_page(page: str, items=None, root: str = ROOT, declarations: dict | None = None) -> list[str]:
    """The problems of a rendered results page (``items``: results.collect's, for the
    ``Regenerate:`` lines and the epsilons): a machine-local path; a reference to a file the
    repository does not hold (names inside figure links and the run store's own paths included);
    an artefact whose published run charges a simulated population without its section declaring
    the SIMULATED and SPENT epsilons; a ``Regenerate:`` line that is not the published run's
    recorded command."""
    problems = []
    for m in MACHINE_PATH.finditer(page):
        problems.append(f"machine path: {m.group(1)}")
    for m in FILE_REF.finditer(page):
        ref = m.group(1)
        if not _exists(ref, root):
            problems.append(f"dangling file reference: {ref}")
    if items is not None:
        decl = read_privacy() if declarations is None else declarations
        for item in items:
            a = item["artefact"]
            if item["source"] is None:
                continue
            sec = page.split(f"\n## {a.name} ", 1)[1].split("\n## ", 1)[0] if f"\n## {a.name} " in page else ""
            cmd = item["record"].get("command")
            regen = re.findall(r"^Regenerate: `([^`]*)`", sec, re.M)
            if not regen or regen[0] != cmd:
                problems.append(f"{a.name}: Regenerate line {regen[:1]} is not the published command {cmd!r}")
            if simulated(a.module, decl) and not ("SIMULATED" in sec and "SPENT" in sec):
                problems.append(f"{a.name}: a simulated epsilon without its SIMULATED / SPENT declaration")
            if re.search(r"fits? epsilon [0-9.]+ \(delta [0-9e.-]+\);", sec):
                problems.append(f"{a.name}: 'fit epsilon' without saying the population is simulated")
    return problems
