"""Where a benchmark's figures go: ``bench/results/<name>.json``, and the terminal when asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_results(path: Path, figures: dict[str, Any], *, echo: bool = False) -> None:
    """Write ``figures`` as indented JSON to ``path`` (its folder made first); print them too with ``echo``."""
    text = json.dumps(figures, indent=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    if echo:
        print(text)
