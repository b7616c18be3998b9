"""fedpriv.models."""
