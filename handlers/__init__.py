"""handlers."""
