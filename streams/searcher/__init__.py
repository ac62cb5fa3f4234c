"""An experiment's searcher, in two wings, like the brain.

`core/` decides: an experiment's event-sourced state, the searchers (grid, random, ASHA)
and the median-stop assessor, as synchronous code with no I/O, so a searcher restarted
from its checkpoint derives the same decisions. `runtime/` moves records in and decisions
and their effects out, with the experiments' states checkpointed in the env's Postgres.
`trials.py` turns a decision into its effects on the env's operator (pure).
"""
