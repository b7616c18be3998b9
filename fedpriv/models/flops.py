"""Matmul FLOPs of a JAX function, counted on its jaxpr (issue 53: the client cost per round).

XLA's ``compiled.cost_analysis()`` counts the body of a loop once whatever its trip count, so a
model whose blocks run under ``lax.scan`` (the Llama's layers, the LSTM's time steps) is
under-counted by the number of iterations. ``matmul_flops(fn, *args)`` traces ``fn`` to its
jaxpr and adds ``2 · batch · M · N · K`` for every ``dot_general`` (a multiply-add is 2 FLOPs),
multiplying a ``scan`` body by its length and recursing into every sub-jaxpr (``jit``, remat,
custom derivative rules, the branches of a ``cond``: the largest). What autodiff actually traces
is counted: gradients that are not needed are not computed, so not counted. Elementwise work
(norms, softmax, the optimizer's update) is not counted: for the models here it is < 2 % of the
matmuls (`tests/experiments/test_llm_lora.py`).

Raises ``ValueError`` on a ``while`` loop (its trip count is not static).
"""
from __future__ import annotations

import math

import jax


def _dot_flops(eqn) -> float:
    (lc, rc), (lb, _rb) = eqn.params["dimension_numbers"]
    lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
    batch = math.prod(lhs[d] for d in lb)
    contract = math.prod(lhs[d] for d in lc)
    m = math.prod(s for d, s in enumerate(lhs) if d not in lc and d not in lb)
    n = math.prod(s for d, s in enumerate(rhs) if d not in rc and d not in _rb)
    return 2.0 * batch * contract * m * n


def _sub_jaxprs(eqn):
    for v in eqn.params.values():
        for x in (v if isinstance(v, (tuple, list)) else (v,)):
            if hasattr(x, "eqns"):
                yield x
            elif hasattr(x, "jaxpr") and hasattr(x.jaxpr, "eqns"):
                yield x.jaxpr


def jaxpr_matmul_flops(jaxpr) -> float:
    """Matmul FLOPs of a (closed) jaxpr (module docstring)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            total += _dot_flops(eqn)
        elif name == "while":
            raise ValueError("a while loop's trip count is not static: its FLOPs cannot be counted")
        elif name == "scan":
            total += eqn.params["length"] * jaxpr_matmul_flops(eqn.params["jaxpr"])
        elif name == "cond":
            total += max((jaxpr_matmul_flops(b) for b in eqn.params["branches"]), default=0.0)
        else:
            total += sum(jaxpr_matmul_flops(j) for j in _sub_jaxprs(eqn))
    return total


def matmul_flops(fn, *args, **kwargs) -> float:
    """Matmul FLOPs of one call ``fn(*args, **kwargs)`` (traced, not run), after dead-code
    elimination (a gradient autodiff traces but nothing uses, e.g. the input gradient of a block
    whose input is a constant, is not computed by XLA either)."""
    from jax._src.interpreters import partial_eval as pe
    closed = jax.make_jaxpr(fn)(*args, **kwargs)
    jaxpr, _ = pe.dce_jaxpr(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
    return jaxpr_matmul_flops(jaxpr)
