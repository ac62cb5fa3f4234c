"""The `dlrover-events` command line: the root in `app` (its `main` is the console
script), how a command runs and exits in `runner`, one module per built-in command."""
