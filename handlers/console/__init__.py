"""The web console: one page per env that tails its topics live (server-sent events),
filters by job and type, and shows the jobs with their current resources and last plan,
and the evaluators' reports. Authenticated with the gateway's bearer tokens (read scope).
"""
