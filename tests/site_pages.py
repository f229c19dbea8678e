"""What the site tests read from a built site (shared by test_site.py and test_browser.py)."""

from __future__ import annotations

import re


def figures_announced(cells: list[dict]) -> int:
    """How many figures the tutorial wrote: save_figure prints `figure: PATH` for each (a
    tutorial may list paths again later, so distinct paths are counted)."""
    text = "".join(
        "".join(o.get("text", ""))
        for c in cells
        for o in c.get("outputs", [])
        if o.get("name") == "stdout"
    )
    return len(set(re.findall(r"^figure: (.+)$", text, flags=re.M)))
