"""The Kafka plumbing: topic naming, connecting, administering topics, producing,
consuming with dead letters, reading without a group (to the end, following, compacted),
and tailing. It knows nothing of the processes that use it (no `runtime`, `envs`, `store`).

Empty on purpose: the SDK's distribution ships some of these modules and not others.
"""
