"""The env's checkpoints: the service that records them and applies retention
(`service`), and the `checkpoint` and `model` commands (`cli`). The catalog's and the
registry's queries and the retention policy are dlrover_events.checkpoints."""
