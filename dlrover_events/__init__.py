"""dlrover_events."""
