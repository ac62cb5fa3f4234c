"""The config gateway: training jobs fetch their merged configuration over HTTP.

``matching`` decides (pure); ``store`` writes documents to Postgres and announces them on
``<env>.config.changes``; ``follower`` keeps each instance's in-memory index from that
topic; ``configmaps`` (pure) and ``configmaps_runner`` (the watch) feed labelled
Kubernetes ConfigMaps into ``store``, when asked to; ``app`` is the thin aiohttp layer;
``service`` runs it under `dlrover-events up`.
"""
