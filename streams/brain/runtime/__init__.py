"""The Brain's I/O shell around `streams.brain.core`: the faust app and its glue, the
courier that publishes plans, checkpoints in the env's Postgres, recovery after a
restart, leadership, retention's deletes, and the followers of configs and settings.
"""
