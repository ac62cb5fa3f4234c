"""The config gateway: training jobs fetch their merged configuration over HTTP.

``dlrover_events.config.matching`` decides (pure, shared with the brain); ``store`` writes
documents to Postgres and announces them on ``<env>.config.changes``; ``state`` is each
instance's in-memory index, kept from that topic by ``dlrover_events.config.feed``;
``configmaps`` (pure) and ``configmaps_runner`` (the watch) feed labelled Kubernetes
ConfigMaps into ``store``, when asked to; ``app`` is the thin aiohttp layer; ``service``
runs it under `dlrover-events up`.
"""
