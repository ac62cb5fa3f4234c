"""The local platform: TrainingJobs run as processes on this machine, one torchrun agent per
node, driven by the same reconciler as on Kubernetes (see ``cluster.LocalCluster``)."""
