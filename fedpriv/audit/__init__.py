"""Empirical privacy audit of the FL engine with canary clients (one-shot estimation).

Method: G. Andrew, P. Kairouz, S. Oh, A. Oprea, H. B. McMahan, V. M. Suriyakumar, "One-shot
Empirical Privacy Estimation for Federated Learning", ICLR 2024 (arXiv:2302.03098).

``python -m fedpriv audit`` runs the *real* engine (``fedpriv.fl.algorithms.dp_fedavg`` /
``dp_ftrl`` -> ``init`` / ``apply`` on cohorts from ``fedpriv.fl.cohort.build_cohort``, drawn by
the real samplers) on a population that contains ``k`` canary clients, and compares an
empirical epsilon with the accountant's epsilon of the same run (``privacy_event`` of the
claimed ``DPConfig`` and sampler).

Canaries. The model is a vector ``w in R^d`` with the linear loss ``-sum_b mask_b <x_b, w>``;
with one local SGD step of learning rate 1 a client's delta is exactly its vector ``x``.
Canary ``i`` holds ``x = a C u_i`` with ``u_i`` a uniformly random unit direction and
``a > 1`` (``canary_norm``), so after clipping its update is exactly ``C u_i``. Real clients
hold random vectors of norm in ``[0.25 C, 1.5 C]``. ``k'`` further random directions
``v_j`` are never inserted (held out). In high dimension (``d ~ 1e4``) all directions are
nearly orthogonal.

Statistics (one per threat model, each computed for the k inserted and the k' held-out
directions):

* ``final`` (the paper's final-model statistic): ``cos(theta_T - theta_0, u)``.
* ``iterates`` (all iterates released, participation unknown; our extension): with
  ``A in R^{T x d}`` the per-round model deltas, ``E = d * ||P_A u||^2``, d times the squared
  norm of the direction's projection on the span of the released updates (``= s^T Sigma^-1 s``
  with ``s = A u`` and ``Sigma = A A^T / d`` the across-round covariance estimated from all
  coordinates). It is invariant to any linear mixing of rounds, so it sees through
  correlated noise (tree aggregation, or noise repeated every round); for a held-out
  direction ``E ~ chi^2_T`` whatever the mechanism. The statistic is ``(E / T)^(1/3)``
  (Wilson-Hilferty), which is close to Gaussian as the fit assumes (the raw chi^2 is skewed
  and its inflated variance alone inflates the estimate).
* ``known`` (all iterates, the canary's rounds known; our extension, only for samplers
  whose accounting does not rely on secret participation, i.e. ``ShuffledPassSampler``):
  the generalised-least-squares score ``b^T Sigma^-1 s / sqrt(b^T Sigma^-1 b)`` with ``b``
  the canary's participation pattern (over the canaries that took part); a held-out
  direction gets the pattern of a participating real client (same sampler), so its score is
  ``~ N(0, 1)``.

Estimate. As in the paper, a Gaussian is fitted to each of the two samples and the
estimate is the epsilon, at the run's delta, of the mechanism that outputs one draw of
``N(mu_out, s_out^2)`` or ``N(mu_in, s_in^2)`` (both orders; unequal variances handled
exactly: ``delta(eps) = P(L > eps) - e^eps Q(L > eps)`` with the quadratic log-likelihood
ratio ``L``). The reported lower bound is the largest of the statistics' estimates. A 90%
percentile bootstrap over canaries and held-out directions gives its finite-sample spread; the
verdict calls a run above the accountant *significant* only when the interval's lower end is
above the accountant's epsilon (a point estimate alone above it is reported as not significant),
and *inconclusive* when the audit's resolution (the same estimate between two disjoint sets of
held-out directions) is not below the accountant's epsilon.

What the number is: an *estimate* of a lower bound on the epsilon of the run, valid under the
one-shot method's assumptions (the statistics are close to Gaussian; canaries are
representative worst-case clients; the bootstrap covers only the finite-sample error of the
fitted means and variances; taking the largest of 2-3 statistics adds a little selection bias).
It is not a proof of anything: an estimate below the accountant's epsilon does not prove the
implementation private, and an estimate above it is strong evidence of a bug, not a proof.

Deliberately broken variants (built here from engine components; the engine is not edited),
each run while the accountant is still given the *claimed* configuration:

* ``half-noise``: the engine adds noise ``z/2`` while the event claims ``z``;
* ``no-clip``: the engine clips at ``1e6 C`` (i.e. not at all) with the noise std of ``z C``;
* ``reused-key``: the noise state is reset to its initial value before every round, so the
  same noise (same key) is added every round;
* ``twice-per-epoch`` (DP-FTRL only): a ``ShuffledPassSampler`` subclass that gives every
  cohort of an epoch two consecutive rounds, so each sampled client is in two leaves of
  the same tree, while the event claims one participation per epoch.
"""
from fedpriv.audit.cli import build_parser, main, markdown_table, plan, report_markdown
from fedpriv.audit.core import (  # noqa: F401 (_build, _sampler: for the tests)
                                BREAK_LABELS,
                                BREAKS,
                                MECHANISMS,
                                PRESETS,
                                AuditError,
                                AuditSettings,
                                CanaryPopulation,
                                TwicePerEpochSampler,
                                _build,
                                _sampler,
                                accountant_epsilon,
                                audit_verdict,
                                canary_statistics,
                                directions,
                                linear_loss,
                                run_audit,
                                run_engine,
)
from fedpriv.audit.epsilon import bootstrap_interval, estimate_epsilon, gaussian_pair_epsilon, null_epsilon

__all__ = ["build_parser", "main", "markdown_table", "plan", "report_markdown", "BREAK_LABELS",
           "BREAKS", "MECHANISMS", "PRESETS", "AuditError", "AuditSettings", "CanaryPopulation",
           "TwicePerEpochSampler", "accountant_epsilon", "audit_verdict", "canary_statistics", "directions",
           "linear_loss", "run_audit", "run_engine", "bootstrap_interval", "estimate_epsilon",
           "gaussian_pair_epsilon", "null_epsilon"]
