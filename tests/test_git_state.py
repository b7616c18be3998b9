"""``fedpriv.report.git_state`` records the commit a run started at (read once per process)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.skipif(subprocess.run(["git", "--version"], capture_output=True).returncode != 0,
                    reason="git not installed")
def test_a_commit_made_while_a_run_trains_does_not_relabel_it(tmp_path):
    """A copy of fedpriv in a throw-away repository: the process reads git_state at start
    (importing ``experiments``), a commit lands, and the run still reports the first commit;
    an explicit ``cwd`` is read afresh."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for pkg in ("fedpriv", "experiments"):
        subprocess.run(["cp", "-r", os.path.join(REPO, pkg), str(repo / pkg)], check=True)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "fedpriv/report.py", "fedpriv/verdicts.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    first = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    script = textwrap.dedent(f"""
        import subprocess, experiments
        from fedpriv.report import git_state
        subprocess.run({git!r} + ["commit", "-q", "--allow-empty", "-m", "second"], check=True)
        print(git_state()["git_commit_full"], git_state(cwd={str(repo)!r})["git_commit_full"])
    """)
    env = dict(os.environ, FEDPRIV_XLA_CACHE="off", PYTHONPATH=str(repo))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         cwd=str(repo), timeout=120)
    assert out.returncode == 0, out.stderr
    at_start, now = out.stdout.split()
    assert at_start == first and now != first
