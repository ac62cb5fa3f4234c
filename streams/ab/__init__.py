"""A/B tests of brain settings: one virtual env per arm, fed the same input, compared."""
