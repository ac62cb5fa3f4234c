"""The searcher's I/O shell around `streams.searcher.core`: the consumer of the
experiment, trial-metric, job-request and job-event topics, the experiments' states and
their outbox in the env's Postgres, and the service and command that run it.
"""
