"""Evaluators: KPIs of an env over a window, from what happened on its topics."""
