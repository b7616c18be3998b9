"""docs/fidelity.md is generated from the configs (python -m experiments.fidelity): every
artefact of ``python -m experiments --list`` has its row; refusals and GPU estimates are labelled."""
import pathlib

from experiments.__main__ import listing
from fedpriv.recipes import fidelity

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_generator_covers_every_listed_artefact():
    rows = fidelity.artefact_rows(account_plans=False)
    names = [r["artefact"] for r in listing()]
    assert [r["name"] for r in rows] == names
    text = fidelity.render(rows)
    for n in names:
        assert f"## {n} (" in text
    for r in rows:
        gpu = r["ours"]["GPU time"]
        # never an unmeasured time stated as a measurement
        assert gpu == "-" or gpu.startswith("not measured"), (r["name"], gpu)
        if "H100-hours" in gpu:
            assert "ESTIMATE" in gpu
    refused = [r["name"] for r in rows if r["ours"]["data"].startswith("REFUSED: ")]
    assert set(refused) >= {"hou-table2", "koga-table1"}  # the paper's data is not packaged


def test_wang_row_states_both_epsilons():
    (row,) = fidelity.artefact_rows(account_plans=True, names=("wang-appc-sweep",))
    eps = row["ours"]["epsilon"]
    assert "1.77 SIMULATED (TFF StackOverflow (train), 342,477 users)" in eps
    assert "18.2 SPENT on our users (chitchat (1,053 training users))" in eps


def test_committed_page_lists_every_artefact():
    text = (ROOT / "docs" / "fidelity.md").read_text()
    assert "python -m experiments.fidelity" in text
    for r in listing():
        assert f"## {r['artefact']} (" in text, r["artefact"]
