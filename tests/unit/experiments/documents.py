"""Experiment documents the experiments' tests share: a valid one, as a user writes it."""

from __future__ import annotations

import copy
from typing import Any

_DOCUMENT: dict[str, Any] = {
    "apiVersion": "dlrover-events.io/v1alpha1",
    "kind": "Experiment",
    "metadata": {"name": "mlp-sweep"},
    "spec": {
        "owner": "research",
        "hyperparameters": {
            "lr": {"type": "log", "base": 10, "minval": -4, "maxval": -1, "count": 4},
            "width": {"type": "int", "minval": 8, "maxval": 128, "count": 4},
            "act": {"type": "categorical", "vals": ["relu", "tanh"]},
            "epochs": {"type": "const", "val": 1},
        },
        "searcher": {
            "name": "asha",
            "metric": "val_loss",
            "smaller_is_better": True,
            "max_trials": 16,
            "max_concurrent_trials": 4,
            "budget": {"unit": "steps", "max": 800},
            "seed": 7,
        },
        "trial": {
            "spec": {
                "roles": {
                    "worker": {
                        "replicas": 1,
                        "template": {
                            "spec": {
                                "containers": [{"name": "main", "image": "x", "command": ["true"]}]
                            }
                        },
                    }
                }
            }
        },
    },
}


def document(experiment: str = "mlp-sweep", **searcher: Any) -> dict[str, Any]:
    """A valid experiment document named ``experiment``, its searcher's fields overridden."""
    doc = copy.deepcopy(_DOCUMENT)
    doc["metadata"]["name"] = experiment
    doc["spec"]["searcher"].update(searcher)
    return doc
