"""The platforms' registry (handlers/operator/platform/registry.py): each platform's doors
take that platform's own options, typed, and refuse another's in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from handlers.operator.platform.registry import (
    PLATFORMS,
    ClusterOptions,
    NoOptions,
    NotAnOption,
    UnknownPlatform,
)


def test_each_platform_takes_its_own_options() -> None:
    kube = PLATFORMS["kubernetes"].options_of(kubeconfig=Path("/k"), namespace="ns")
    assert kube == ClusterOptions(kubeconfig=Path("/k"), namespace="ns")
    assert PLATFORMS["kubernetes"].options_of() == ClusterOptions()
    assert PLATFORMS["local"].options_of(kubeconfig=None, namespace=None) == NoOptions()


def test_an_option_the_platform_does_not_take_is_one_line() -> None:
    with pytest.raises(NotAnOption, match=r"^the local platform takes no --kubeconfig$"):
        PLATFORMS["local"].options_of(kubeconfig=Path("/k"))
    with pytest.raises(NotAnOption, match="takes no --namespace"):
        PLATFORMS["local"].options_of(namespace="ns")


def test_an_unknown_platform_names_the_known_ones() -> None:
    with pytest.raises(
        UnknownPlatform, match="unknown platform 'k8s'; known: hosts, kubernetes, local"
    ):
        PLATFORMS["k8s"]


def test_the_doors_read_the_platform_from_the_registry_not_its_name() -> None:
    """What differs between platforms at the doors is declared on the entry."""
    local, kube = PLATFORMS["local"], PLATFORMS["kubernetes"]
    assert local.env_scoped and local.runs_in_workdir
    assert not kube.env_scoped and not kube.runs_in_workdir
    doors = Path(__file__).resolve().parents[4] / "handlers" / "operator" / "doors"
    for source in doors.glob("*.py"):
        text = source.read_text()
        assert '== "local"' not in text and '== "kubernetes"' not in text, source.name
