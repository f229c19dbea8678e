"""Optional figures: matplotlib when installed (the `plot` extra), written to files, never shown.

Tutorials and reports call `pyplot()` once; None means "print the numbers, skip the plots".
"""

from __future__ import annotations

import os
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
    """Lay out, write (120 dpi), close and announce one figure; returns its path. Written
    atomically (a temporary file beside it, then os.replace): a reader, or a run that dies in
    the middle, never sees half a figure."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        # The format from the real name: the temporary one's suffix is not a format.
        fig.savefig(tmp, dpi=120, format=path.suffix[1:] or "png")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if tmp.exists():
            tmp.unlink()
    print(f"figure: {path}")
    return path


def figure_formats() -> tuple[str, ...]:
    """The file suffixes matplotlib can write (png, pdf, svg, ...); () without matplotlib."""
    if pyplot() is None:
        return ()
    from matplotlib.backend_bases import FigureCanvasBase

    return tuple(sorted(FigureCanvasBase.get_supported_filetypes()))
