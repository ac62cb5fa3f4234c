"""The web console: per env the live events, the jobs and each job's timeline and charts,
the evaluators' reports, the A/B results, the dead letters and the config documents; an
env switcher over the registry; actions (scale, delete, promote, revoke) behind the env's
admin token, each the CLI's way. Authenticated with the gateway's bearer tokens
(docs/console.md).
"""
