"""fedpriv.data."""
