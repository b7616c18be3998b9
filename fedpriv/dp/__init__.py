"""fedpriv.dp."""
