"""setuptools' package arguments, which depend on the layout being built: see scripts/wheel_layout.py."""

import sys
from pathlib import Path

from setuptools import setup

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scripts import wheel_layout

setup(**wheel_layout.setup_arguments())
