"""The reconciler of an env's real jobs, the same on every platform: ScalePlans applied
once, pods made to match each job, node and job events and ScaleResults out.

It speaks only the platform port (handlers.operator.platform.api): typed jobs and pods, the
port's errors. Pure decisions (planning: a plan as a job change, a job's pods to create
and delete, its phase and status; events: what a pod's state means for the brain; launch:
what a new pod runs) under one thin adapter (reconciler). Nothing here imports a
platform: Kubernetes (handlers.operator.kube) and the local platform
(handlers.operator.local) implement the port and import this, never the other way round
(tests/unit/test_layering.py).
"""
