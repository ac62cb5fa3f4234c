"""Suites that every implementation of an extension point runs (the platforms'), open to
implementations outside this repository: subclass one, give it its fixtures."""
