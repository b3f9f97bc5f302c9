"""The PEP 517 build backend: setuptools', told which layout to build (:mod:`scripts.wheel_layout`).

The editable hooks (``pip install -e .``) build the repository layout as it is; every other hook
(a wheel, an sdist, their metadata) builds the wheel layout, everything under ``durable_agents``.
"""

from __future__ import annotations

from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (
    build_sdist,
    build_wheel,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_wheel,
)

from scripts import wheel_layout

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    wheel_layout.editable = True
    requires: list[str] = _setuptools.get_requires_for_build_editable(config_settings)
    return requires


def prepare_metadata_for_build_editable(metadata_directory: str, config_settings: dict[str, Any] | None = None) -> str:
    wheel_layout.editable = True
    name: str = _setuptools.prepare_metadata_for_build_editable(metadata_directory, config_settings)
    return name


def build_editable(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    wheel_layout.editable = True
    name: str = _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    return name
