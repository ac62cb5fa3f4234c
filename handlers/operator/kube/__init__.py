"""The real env's operator: TrainingJobs and their pods on a Kubernetes cluster.

Pure decisions (model, planning, podevents, quantity) under thin kubernetes-asyncio
adapters (client, reconciler, runner); the credentials loader and the informer are
shared with the config gateway in dlrover_events.kube. Only runner.py loads cluster
credentials, and only the real env's operator imports this package (modes.RUNNERS).
"""
