"""fedpriv.public."""
