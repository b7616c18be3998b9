"""fedpriv.recipes: configs -> (data, task, algorithm, sampler, event) -> a run.

``fedpriv.recipes.lm``: private FL of an on-device LM on a user-keyed corpus (Wang et al. 2023),
the building block of the LM experiments. ``fedpriv.recipes.public``: the public-training rows of
Wang et al. 2023 (Table 2/3) on top of it and of ``fedpriv.public``. The population-expansion and
FreD pipelines live with their methods (``fedpriv.expansion``, ``fedpriv.fred``).
"""
