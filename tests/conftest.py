import contextlib
import os

# Tests run on the CPU; keep XLA from grabbing every core's threads twice over.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# Each pytest-xdist worker on a core of its own (the n-th worker on the n-th of the cores this
# process may use), set before jax is imported anywhere: XLA sizes its CPU thread pools by the
# cores a process may use, so two workers on two cores otherwise run four compute threads and
# compile and run each other's programs in turn. Tests that need several cores (the executor's
# pools) widen it again for their duration (`all_cores`). ALL_CPUS: the cores before pinning.
# Measured on this 2-core CPU, the whole suite under -n 2 (warm caches): 543 s wall and 1,019
# CPU-s unpinned, 501 s and 915 CPU-s pinned (two sessions apart); fresh clones back to back:
# 598 s / 1,108 CPU-s unpinned, 577 s / 1,080 pinned. FEDPRIV_TEST_PIN=0 leaves them unpinned.
_AFFINITY = hasattr(os, "sched_getaffinity") and hasattr(os, "sched_setaffinity")  # Linux
ALL_CPUS = tuple(sorted(os.sched_getaffinity(0))) if _AFFINITY else tuple(range(os.cpu_count() or 1))
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def _set_affinity(cpus):
    if cpus is not None:
        try:
            os.sched_setaffinity(0, cpus)
        except (OSError, ValueError):  # a sandbox that forbids it: left as it is (workers unpinned)
            pass


if (_AFFINITY and _WORKER.startswith("gw") and os.environ.get("FEDPRIV_TEST_PIN", "1") != "0"
        and int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) <= len(ALL_CPUS)):
    _set_affinity({ALL_CPUS[int(_WORKER[2:]) % len(ALL_CPUS)]})


@contextlib.contextmanager
def all_cores():
    """Within it this process (and what it starts) may use every core again (ALL_CPUS)."""
    saved = os.sched_getaffinity(0) if _AFFINITY else None
    _set_affinity(set(ALL_CPUS) if _AFFINITY else None)
    try:
        yield
    finally:
        _set_affinity(saved)


# Experiments called through their main() run every run in the test process (--workers 0)
# unless a test asks for workers: the executor's own tests (tests/executor) do.
os.environ.setdefault("FEDPRIV_WORKERS", "0")

# One persistent XLA compilation cache for the whole run, shared by the xdist workers and the
# subprocesses tests start (env vars, read when jax is imported): many tests compile the same
# small models (smoke configs) in separate closures, which jit's in-memory cache cannot share.
# A cache hit loads the executable XLA compiled for the same HLO, flags and jax version (part of
# the key), so results are unchanged. Measured: tests/experiments/test_lm_experiments.py 62.7 s
# -> 49.5 s from a cold cache (22.9 s warm). Set JAX_COMPILATION_CACHE_DIR to move or reuse it.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    import getpass
    import tempfile
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(
        tempfile.gettempdir(), f"fedpriv-test-xla-cache-{getpass.getuser()}")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

# XLA's CPU backend at optimisation level 0 (LLVM without its expensive passes) for the test
# process and every subprocess it starts (they inherit os.environ; tests that set XLA_FLAGS for
# a subprocess append to it: tests/conftest.xla_flags). The suite is dominated by compiling many
# small programs once each, not by running them: measured from a cold cache on this 2-core CPU,
# tests/models/test_length_buckets.py + tests/fl/test_engine.py 81 s -> 29 s, and
# tests/experiments/test_lm_experiments.py + tests/dp/test_ddg.py 251 s -> 71 s, all passing.
# XLA's newer fusion emitters are off as well (--xla_cpu_use_fusion_emitters=false: the CPU
# backend's LLVM IR emitters generate the fusions): measured on this 2-core CPU, the engine's
# round program (jit_apply_packed of the lm_fl smoke config) compiles in 3.3 instead of 10 CPU-s,
# the BERT embedder runs as fast, and tests/experiments/test_lm_experiments.py takes 43 instead
# of 103 CPU-s (its six round programs were 56 of them).
# Results differ from the default level only by float rounding (fusion, no FMA contraction):
# tolerances come from the numerics, and every "bit-identical" test compares two runs under the
# same flags. FEDPRIV_TEST_XLA_OPT=default runs the suite at XLA's default settings instead.
TEST_XLA_FLAGS = ("" if os.environ.get("FEDPRIV_TEST_XLA_OPT") == "default"
                  else "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false")
if TEST_XLA_FLAGS and TEST_XLA_FLAGS not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + TEST_XLA_FLAGS).strip()


def xla_flags(*extra: str) -> str:
    """``XLA_FLAGS`` for a test's subprocess: the suite's (above) plus ``extra``."""
    return " ".join(f for f in (TEST_XLA_FLAGS, *extra) if f)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


# pytest-xdist's --dist loadfile hands out one file at a time, by default sorted by its NUMBER
# of tests (--loadscope-reorder), which put the slowest files (a few long tests each:
# test_configs_heavy*.py, test_lm_experiments.py, test_fred_*.py, test_public_training.py) at
# the end of the queue, where one worker ran them while the other sat idle. Instead the files
# below, every file over ~10 s measured on the 2-core CPU (--durations=0, summed per file; the
# executor's by its time under -n 2, where its workers compete), go first, slowest first (the
# smoke runs' LLM teacher and BERT users at the head, so each xdist worker warms those caches
# once); every other file (each < 10 s) follows in collection order, which keeps the tail
# short. Only the order changes, never a test.
SLOWEST_FILES_FIRST = (
    "tests/experiments/test_pre_text.py",
    "tests/experiments/test_llm_lora.py",
    "tests/test_audit.py",
    "tests/executor/test_experiments.py",
    "tests/fl/test_resume.py",
    "tests/public/test_algorithm.py",
    "tests/experiments/test_public_training.py",
    "tests/experiments/test_plan_charges.py",
    "tests/test_extensions.py",
    "tests/test_bad_inputs.py",
    "tests/dp/test_ddg.py",
    "tests/experiments/test_lm_experiments.py",
    "tests/fl/test_packed.py",
    "tests/experiments/test_configs.py",
    "tests/experiments/test_fred_mixtures.py",
    "tests/experiments/test_configs_heavy.py",
    "tests/test_packaging.py",
    "tests/fl/test_hooks.py",
    "tests/fl/test_workdir_lock.py",
    "tests/test_cli.py",
    "tests/experiments/test_fred_pipeline.py",
    "tests/fl/test_samplers_loop.py",
    "tests/models/test_lora.py",
    "tests/models/test_llama.py",
    "tests/dp/test_privacy_events.py",
    "tests/dp/test_jax_privacy_crosscheck.py",
    "tests/fl/test_multiprocess.py",
    "tests/dp/test_accounting_ledger.py",
    "tests/experiments/test_population_expansion.py",
    "tests/experiments/test_iw_regime.py",
    "tests/models/test_length_buckets.py",
    "tests/fl/test_ddg_engine.py",
    "tests/synth/test_votes.py",
    "tests/experiments/test_runstore.py",
    "tests/models/test_generate.py",
    "tests/experiments/test_configs_heavy_iw.py",
    "tests/experiments/test_paper_configs.py",
    "tests/experiments/test_wang.py",
    "tests/experiments/test_ddg_comparison.py",
)


def pytest_configure(config):
    if getattr(config.option, "loadscopereorder", None):  # xdist loaded: keep the order below
        config.option.loadscopereorder = False


def _order(nodeid: str, rank: dict) -> int:
    """tests/data first (its session fixture points $FEDPRIV_CACHE at a fresh directory for the
    rest of the worker's session: run first, the corpora it loads there serve every later test;
    run after the experiments, they would be loaded cold a second time), then the slowest files,
    then the rest."""
    path = nodeid.split("::", 1)[0]
    return -1 if path.startswith("tests/data/") else rank.get(path, len(rank))


def pytest_collection_modifyitems(config, items):
    rank = {f: i for i, f in enumerate(SLOWEST_FILES_FIRST)}
    items.sort(key=lambda item: _order(item.nodeid, rank))  # stable
