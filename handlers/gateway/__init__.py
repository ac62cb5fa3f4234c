"""The config gateway: training jobs fetch their merged configuration over HTTP.

``matching`` decides (pure); ``store`` writes documents to Postgres and announces them on
``<env>.config.changes``; ``follower`` keeps each instance's in-memory index from that
topic; ``app`` is the thin aiohttp layer; ``service`` runs it under `dlrover-events up`.
"""
