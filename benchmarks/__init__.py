"""Benchmarks: scripts run by hand (python benchmarks/NAME.py); a package only so the type checker names them."""
