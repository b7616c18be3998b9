"""FreD (Hou et al. 2023): a differentially private Fréchet distance between a public and a
federated dataset, and the FreD -> prefinetune -> DP-FL pipeline (``papers/fred_hou2023.md``).

Modules, by concern:

- :mod:`fedpriv.fred.distance`: Eq. 2 (Fréchet distance of two Gaussians) in float64, PSD
  projection, public Gaussian statistics, public PCA basis (numerics, no privacy);
- :mod:`fedpriv.fred.private`: Algorithm 1's private side (``private_stats``) on top of the
  Gaussian moment releases of :mod:`fedpriv.dp.moments`, and scoring (``fred``,
  ``rank_candidates``: post-processing of one release);
- :mod:`fedpriv.fred.embed`: the candidate datasets and their embedding with the BERT embedder
  (``fedpriv.models.bert``), cached;
- :mod:`fedpriv.fred.compare`: private vs non-private FreD over seeds (Table 1 analogue);
- :mod:`fedpriv.fred.mixtures`: Y% prefinetuning mixtures, FreD vs Y and their verdicts
  (Table 2 / Figure 2; functions of arrays).

The pipelines built on them are recipes (they run the LM recipe): FreD release -> central
prefinetuning -> DP FL-finetuning as ``fedpriv.fl.stages`` stages under one ledger is
:mod:`fedpriv.recipes.fred_pipeline`, the mixtures experiment's stages
:mod:`fedpriv.recipes.fred_mixtures`.

Calibration, sensitivities, events and the jitted secure sums are in :mod:`fedpriv.dp.moments`.
"""
from fedpriv.fred.distance import (
                                   GaussianStats,
                                   check_embeddings,
                                   frechet_distance,
                                   fred_nonprivate,
                                   gaussian_stats,
                                   pca_basis,
                                   project_psd,
                                   psd_sqrt,
                                   trace_sqrt_product,
)
from fedpriv.fred.private import (
                                   CALIBRATIONS,
                                   RELATIONS,
                                   UNITS,
                                   PackedClients,
                                   PrivateStats,
                                   fred,
                                   fred_noise_keys,
                                   pack_clients,
                                   private_stats,
                                   rank_candidates,
                                   sensitivities,
)

__all__ = ["CALIBRATIONS", "RELATIONS", "UNITS", "GaussianStats", "PackedClients", "PrivateStats",
           "check_embeddings", "frechet_distance", "fred", "fred_noise_keys", "fred_nonprivate",
           "gaussian_stats", "pack_clients", "pca_basis", "private_stats", "project_psd",
           "psd_sqrt", "rank_candidates", "sensitivities", "trace_sqrt_product"]
