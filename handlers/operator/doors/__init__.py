"""How people and programs reach an env's jobs: the `job` commands, the jobs HTTP API and
the actions behind both (and the console's). They open a platform through the registry
and never reach a platform's client."""
