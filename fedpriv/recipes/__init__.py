"""fedpriv.recipes: configs -> (data, task, algorithm, sampler, event) -> a run.

``fedpriv.recipes.lm``: private FL of an on-device LM on a user-keyed corpus (Wang et al. 2023),
the building block of the LM experiments. The population-expansion, FreD and public-data
pipelines live with their methods (``fedpriv.expansion``, ``fedpriv.fred``, ``fedpriv.public``).
"""
