"""The Brain's pure core: job state, triggers, router, optimizers, planner, schedulers and
the stream processor.

Everything here is synchronous code over typed models with no I/O (no broker, database,
HTTP or Kubernetes client, nothing of `streams.brain.runtime`), so the runtime around it
stays thin and every decision can be replayed and tested offline.
"""
