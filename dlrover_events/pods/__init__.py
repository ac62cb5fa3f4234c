"""A pod as processes on one machine: the shim that runs a node's command and outlives
whoever started it (``shim``), its memory limit (``memory``) and the files it leaves
(``files``). Shared by the two platforms that run pods as processes: the local platform's
operator (handlers.operator.local) and the node agent of plain hosts (handlers.agent),
which meet only on topics and so must not import each other."""
