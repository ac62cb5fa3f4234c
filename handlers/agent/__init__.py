"""The agent of a plain host (issue 35): one per machine, it reports the machine's slots and
liveness on the env's bus and runs the pods the hosts platform's operator places on it.

A handler: it meets the operator only on topics (``<env>.hosts.orders`` in,
``<env>.hosts.reports`` out: schemas.hosts) and imports no other handler; the pod machinery
it shares with the local platform is dlrover_events.pods.
"""
