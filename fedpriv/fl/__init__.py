"""fedpriv.fl."""
