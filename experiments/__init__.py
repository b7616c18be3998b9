"""The experiments: one module per paper artefact (``python -m experiments`` lists them).

Importing this package (every ``python -m experiments.<module>`` does, before jax) turns on
jax's persistent XLA compilation cache for the run unless the environment chose one: a run
then loads what an earlier run (another seed, row, resume or artefact) compiled for the same
program, flags and jax version (the cache key), so results are unchanged and only compile time
goes. Directory: ``$FEDPRIV_XLA_CACHE`` (default ``~/.cache/fedpriv/xla``); ``FEDPRIV_XLA_CACHE=off``
disables it; ``JAX_COMPILATION_CACHE_DIR`` set by the caller wins.

It also reads the checkout's git state now (``fedpriv.report.git_state``): every result of the
run records the commit it started at, even if the tree moves while it trains.
"""
import os

if "JAX_COMPILATION_CACHE_DIR" not in os.environ and os.environ.get("FEDPRIV_XLA_CACHE") != "off":
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.environ.get("FEDPRIV_XLA_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "fedpriv", "xla")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

from fedpriv.report import git_state  # after the cache settings, before any run

git_state()
