"""Optional figures: matplotlib when installed (the `plot` extra), written to files, never shown.

Tutorials and reports call `pyplot()` once; None means "print the numbers, skip the plots".
"""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no window, works on a machine with no screen
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(fig, path: str | Path) -> Path:
    """Lay out, write (120 dpi), close and announce one figure; returns its path."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"figure: {path}")
    return path
