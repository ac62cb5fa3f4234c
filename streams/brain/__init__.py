"""The Brain of an env, in two wings.

`core/` decides: job state and its folds, triggers, the router, optimizers, the planner,
cluster schedulers and the stream processor, as synchronous code over typed models with
no I/O, so every decision can be replayed and tested offline (tests/unit/test_layering.py
keeps it so). `runtime/` moves records in and plans out: the faust glue, the courier,
checkpoints in Postgres, recovery, leadership, retention's deletes and the followers of
config and settings. `bench/` measures the two together.
"""
