"""Cluster-wide schedulers: one allocation of an env's GPUs across all its arrived jobs.

Per-job optimizers (streams.brain.core.optimizers) answer what happened to one job; a
scheduler answers who gets which GPUs, once per round, and so must see every arrived job
at once. The contract every scheduler keeps is `api.py`; the schedulers are pure
functions beside it, registered by name in `registry.py`, explicitly (no import side
effects), so the brain, a dry run and the tests find the same ones.
"""
