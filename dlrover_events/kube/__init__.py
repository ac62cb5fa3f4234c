"""Kubernetes plumbing shared by the services that talk to a cluster (the real operator,
the config gateway's ConfigMap sync): one way to load credentials and resolve the
namespace (``credentials``), the raw list/watch calls (``api``), and one informer
(``informer``). Nothing here decides anything about jobs or configs.

Importing this package does not load credentials: a virtual env's processes never call
``credentials.connect`` and so hold none.
"""
