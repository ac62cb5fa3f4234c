"""Experiments as every door sees them: a document checked the same way wherever it enters
(`document`), the env's experiment tables read and written (`store`), and their rows
shaped for a terminal, a JSON client or the console (`rows`, pure).

The CLI (streams/searcher/cli.py), the REST door (handlers/experiments/) and the console
share these, so an experiment is refused, listed and described in the same words by
each. Only the experiments recorder writes the tables.
"""
