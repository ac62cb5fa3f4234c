"""What streams/ and handlers/ both need to know of training jobs, pure (no I/O), so
neither imports the other: the step-time model and its fit, the workload adapters'
contract.
"""
