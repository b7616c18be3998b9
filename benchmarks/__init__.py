"""Benchmarks: figures, not tests (see BUILD.md)."""
import contextlib
import json
import os
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_results(out: dict, md: str, prefix: str) -> None:
    """``out`` as ``<prefix>.json`` and ``md`` as ``<prefix>.md`` (the folder made if needed)."""
    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    with open(prefix + ".json", "w") as f:
        json.dump(out, f, indent=1)
    with open(prefix + ".md", "w") as f:
        f.write(md)


def git(*args: str) -> str:
    """``git -C <repository> *args``, its stripped stdout (raises on failure)."""
    return subprocess.run(["git", "-C", ROOT, *args], check=True, capture_output=True, text=True).stdout.strip()


def short_commit(ref: str) -> str:
    """The short hash of ``ref`` (raises if it names no commit)."""
    return git("rev-parse", "--short", f"{ref}^{{commit}}")


@contextlib.contextmanager
def worktree(commit: str, parent: str | None = None):
    """A detached ``git worktree`` of ``commit`` in a new temporary directory (under ``parent``),
    removed on exit: an old commit's own code, and a place its runs can publish into."""
    tree = tempfile.mkdtemp(prefix=f"bench-{commit}-", dir=parent)
    git("worktree", "add", "--detach", tree, commit)
    try:
        yield tree
    finally:
        git("worktree", "remove", "--force", tree)
