"""Checkpoints as every door sees them: the retention policy (`retention`, pure), the
env's catalog and model registry read and written (`store`), and a checkpoint's files
removed wherever its URL points (`storage`, fsspec).

The checkpoints service (streams/checkpoints/service.py) records and deletes; the CLI
(streams/checkpoints/cli.py), the REST door (handlers/experiments/models.py) and the
console read and register through the same queries.
"""
