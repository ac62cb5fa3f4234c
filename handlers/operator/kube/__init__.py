"""The Kubernetes platform: TrainingJobs (or PyTorchJobs) and their pods on a cluster.

``cluster.KubeCluster`` implements the platform port (handlers.operator.platform.api) for the
one reconciler (handlers.operator.reconcile): the API calls (client), the workload
adapters that read and write each kind of job (adapter, trainingjob, pytorchjob, pods),
and the operator's process (runner, lease: leader election). The credentials loader is
shared with the config gateway in dlrover_events.kube. Only runner.py loads cluster
credentials, and only the real env's operator on this platform imports this package
(platform.PLATFORMS).
"""
