"""The `dlrover-events` command line."""

from dlrover_events.cli.app import app, main

__all__ = ["app", "main"]
