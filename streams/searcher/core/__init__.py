"""The searcher's pure core: an experiment's event-sourced state and the searchers that
decide on it, with no I/O, so a searcher restarted from its checkpoint derives the same
decisions with the same numbers.

The contract every searcher keeps is `api.py` (a trial's life, in its docstring); the
machinery all searchers share (concurrency, the experiment's pause and kill, the decisions'
numbering, the end) is `state.py` with `begin` and `decide`; the searchers are beside them
(`grid.py`, `random.py`, `asha.py`, with `space.py` for points of a search space and
`median.py` for the median-stop assessor) and named in `registry.py`, explicitly (no import
side effects), so the runtime wing, the CLI and the tests find the same ones. This package
imports none of them, so that importing the contract never loads the searchers.
"""
