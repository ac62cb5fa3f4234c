"""Envs: the registry (Postgres, announced on ``dlrover.control``), following it, an
env's settings, its tokens, and a fresh install's bootstrap.

Empty on purpose: the SDK's distribution ships `control` alone.
"""
