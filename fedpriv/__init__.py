"""fedpriv: differentially private cross-device federated learning of on-device LMs,
helped by public data and public LLMs (Wang et al. 2023; Hou et al. 2023; Koga et al. 2023)."""

__version__ = "0.1.0"
