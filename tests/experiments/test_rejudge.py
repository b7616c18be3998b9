"""experiments.rejudge: the committed verdicts under the current rules, numbers unchanged.

Every rebuilt verdict's sides hold the per-seed values the stored verdicts (or the committed run
store) hold; a claim kept from the stored list keeps its numbers; rebuilding is idempotent; the
project's own checks are classified as such; Koga's new claims on constructed numbers."""
import json
import os

import pytest

from experiments import common, rejudge
from fedpriv import verdicts as V
from fedpriv.report import verdicts_from_json

SUMMARIES = rejudge.SUMMARY_DIR


def _load(module):
    s = json.load(open(os.path.join(SUMMARIES, f"{module}.json")))
    return s, [verdicts_from_json(d) for d in s["verdicts"]]


def _sides(vs):
    """``{(claim, side name): values}`` over the verdicts and their parts."""
    out = {}
    for v in rejudge._walk(vs):
        for s in v.sides:
            out[(v.claim, s["name"])] = {str(k): float(x) for k, x in
                                         (s["values"].items() if isinstance(s["values"], dict)
                                          else enumerate(s["values"]))}
    return out


@pytest.mark.parametrize("module", sorted(rejudge.REBUILDERS))
def test_rebuilt_verdicts_keep_the_committed_numbers(module):
    """Each stored claim that the rebuild keeps (most keep their text) has the same per-seed
    values on each side: the rules changed, the numbers did not."""
    s, old = _load(module)
    new, how = rejudge.current(module, s, old)
    assert "rebuilt" in how or "stored verdicts" in how, how
    before, after = _sides(old), _sides(new)
    shared = set(before) & set(after)
    # (iw_regime's rebuild re-states four of its nine pairs as Koga Table 1's claims: new text,
    # the same values, which the check below covers)
    assert len(shared) >= (0.5 if module == "iw_regime" else 0.6) * len(before), (module, len(shared),
                                                                                len(before))
    for key in shared:
        assert after[key] == pytest.approx(before[key], rel=1e-12, abs=1e-12), key
    # every value the rebuild uses was committed (the stored sides or, for Tables 2/3, the run store)
    if module != "public_training":
        committed = {(name, k, round(x, 12)) for (_, name), vals in before.items() for k, x in vals.items()}
        for (claim, name), vals in after.items():
            for k, x in vals.items():
                if not name.startswith(("gain ", "pre-trained", "most frequent")):
                    assert (name, k, round(x, 12)) in committed, (module, claim, name, k)


@pytest.mark.parametrize("module", sorted(rejudge.REBUILDERS) + ["privacy_utility", "pre_text"])
def test_rejudging_is_idempotent(module):
    s, old = _load(module)
    once, _ = rejudge.current(module, s, old)
    twice, _ = rejudge.current(module, s, once)
    assert [v.to_json() for v in twice] == [v.to_json() for v in once]


def test_project_checks_are_classified():
    s, old = _load("pre_text")
    assert all(v.source == "project" for v in rejudge.current("pre_text", s, old)[0])
    s, old = _load("fred_mixtures")
    new = rejudge.current("fred_mixtures", s, old)[0]
    ours = [v for v in new if v.claim.startswith("(ours")]
    assert ours and all(v.source == "project" for v in ours)
    assert all(v.source == "paper" for v in new if not v.claim.startswith("(ours"))


def test_fred_mixtures_gets_the_resolution_check_from_its_stored_values():
    """Hou Figure 2: the private release's agreement with the noise-free FreD of its estimand,
    rebuilt from the committed per-trial values (once, in the page's order: after the private
    monotone claim); the published sample-level 384-d run agrees in every trial at every Y pair."""
    from fedpriv.fred.mixtures import AGREEMENT_CLAIM
    s, old = _load("fred_mixtures")
    new = rejudge.current("fred_mixtures", s, old)[0]
    agree = [v for v in new if v.claim == AGREEMENT_CLAIM]
    assert len(agree) == 1 and agree[0].source == "project"
    i = new.index(agree[0])
    assert new[i - 1].claim.startswith("private FreD (eps=")
    assert "Y=99->100" in agree[0].measured and agree[0].status in ("reproduced", "not reproduced")


def test_koga_new_claims_on_constructed_numbers():
    """Koga §4.3: "S u T does not improve much" (T w. C beats S u T), IWPT 13 % below S u T (a
    magnitude claim, scaled to our S u T), DSDSR / DEMix cost more communication (exact, from the
    parameter counts); every ordering carries the paper's test perplexities."""
    import types

    from fedpriv.expansion import tables
    cfg = types.SimpleNamespace(datasets=("topics",), schemes=("T w. alpha*C", "T w. C", "S u T", "DSDSR",
                                                                "DEMix", "IW", "PT", "IWPT"))
    ppl = {"T w. alpha*C": 50.0, "T w. C": 40.0, "S u T": 45.0, "DSDSR": 44.0, "DEMix": 44.5, "IW": 41.0,
           "PT": 42.0, "IWPT": 38.0}
    runs = [{"dataset": "topics", "scheme": s, "seed": seed, "test_ppl": p + 0.1 * seed,
             "num_params": 1000 if s not in ("DSDSR", "DEMix") else 1500}
            for s, p in ppl.items() for seed in (0, 1, 2)]
    vs = {v.claim: v for v in tables.verdicts(runs, cfg, {"topics": 80.0})}
    much = vs["[topics] S u T does not improve much: its gain over T w. alpha*C is smaller than T w. C's "
              "(tested as T w. C beats S u T)"]
    assert much.status == V.REPRODUCED and much.paper_values == (358.06, 400.90)
    iwpt = next(v for c, v in vs.items() if "13% lower" in c)
    # IWPT 38 vs S u T 45: 15.6 % lower, the paper's 13 % of our 45.1 is 5.86: a point interval beyond it
    assert iwpt.kind == "magnitude" and iwpt.paper_effect == pytest.approx(-0.13 * 45.1)
    assert iwpt.status == V.REPRODUCED
    comm = next(v for c, v in vs.items() if "communication" in c)
    assert comm.kind == "exact" and comm.status == V.REPRODUCED
    runs = [dict(r, num_params=1000) for r in runs]  # equal sizes: the claim fails, exactly
    assert next(v for v in tables.verdicts(runs, cfg, {"topics": 80.0})
                if "communication" in v.claim).status == V.NOT_REPRODUCED
    assert all(v.paper_values is not None for c, v in vs.items()
               if v.kind == "ordering" and "communication" not in c)


def test_koga_table1_on_chat_target_is_judged_by_the_run_itself():
    """Issue 50 item 3: the 500-round run of the IW regime study judges Koga et al. Table 1's claims
    on chat_target itself (paper claims, every scheme and seed a side), its further pairs and the
    control arm as project checks; the page rejudges them (no rebuild: the 40-round study's
    pairwise-only summary that needed one is gone)."""
    s, old = _load("iw_regime")
    new, how = rejudge.current("iw_regime", s, old)
    assert "iw_regime" not in rejudge.REBUILDERS and how.startswith("rejudged by the current rules"), how
    table1 = [v for v in new if v.claim.startswith("[chat_target]")]
    assert len(table1) == 12 and all(v.source == "paper" for v in table1)
    assert all(v.source == "project" for v in new if v not in table1)
    ioc = next(v for v in table1 if "IW outperforms the S u T baseline" in v.claim)
    seeds = len(common.load_config(s["config"]).seeds)  # the published config's (small: 24)
    assert [sd["name"] for sd in ioc.sides] == ["IW", "S u T"] and all(sd["n"] == seeds for sd in ioc.sides)
    assert any(v.claim.startswith("IW beats S u T") and v.claim.endswith("V = 1000)") for v in new)  # control
    assert [v.to_json() for v in new] == [v.to_json() for v in rejudge.current("iw_regime", s, new)[0]]
