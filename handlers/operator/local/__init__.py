"""The local platform: TrainingJobs run as processes on this machine, one torchrun agent per
node, driven by the same reconciler as on Kubernetes. ``cluster.LocalCluster`` speaks the
platform port natively (numbers, its own job store, its errors): it imports no Kubernetes
client and nothing of handlers.operator.kube (tests/unit/test_layering.py)."""
