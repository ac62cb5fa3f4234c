"""Simulated cluster and job simulator: the pure core of the virtual operator."""
