"""The process runtime: services and how they are found, `up`'s supervision, a service
run as its own command, fencing, metrics, logging, and the embedded broker and Postgres.
"""
