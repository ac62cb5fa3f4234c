"""The virtual env's operator: a simulated cluster driven by the env's plans, its settings
and its clock."""
