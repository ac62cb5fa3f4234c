"""The operator of an env: makes each ScalePlan true and says what happened.

Which operator runs is decided in one place, modes.run_operator, by the env's mode in the
registry: a virtual env gets the simulated cluster (virtual.py), the real env the
Kubernetes reconciler. The virtual modules never import a Kubernetes client.
"""
