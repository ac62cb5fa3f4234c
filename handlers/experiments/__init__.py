"""Experiments over HTTP (``/v1/experiments``, admin token), mounted by the server that
serves ``/v1/jobs``: the document checked and published, the recorder's tables read
(dlrover_events.experiments). No searcher here: handlers never import streams, so an
unknown searcher's name is refused by the searcher itself (its ``done`` says why)."""
