"""The Brain's pure core: job state, optimizer router, optimizers and planner.

Everything here is synchronous code over pydantic models with no I/O, so the stream
processor around it stays thin and every decision can be replayed and tested offline.
"""
