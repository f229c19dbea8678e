"""Optional figures: matplotlib when installed (the `plot` extra), written to files, and shown
inline when the code runs in a notebook.

Tutorials and reports call `pyplot()` once; None means "print the numbers, skip the plots".
Every figure draws a method in its own colour and line style (`method_style`), the same in
compare's figures, the studies' and the sweeps'.
A tutorial runs two ways: as a script (`python tutorials/05_pipe_sgd.py`), where each figure is
written to a file and its path printed, and as a notebook (Jupyter, VS Code, `jupyter nbconvert
--execute`, the docs site), where the same figure is also displayed in the cell's output.
"""

from __future__ import annotations

import os
import sys
import zlib
from pathlib import Path

# Each method's (colour, line style): no two share a colour, so sync and ddp, or pipe and its
# compensations, never look alike; a label not listed (another width, another codec) gets one
# of SPARE's colours, chosen by its name, dash-dotted.
METHOD_STYLES = {
    "ps-sync": ("tab:red", "-"),
    "ps-async": ("tab:orange", "--"),
    "sync": ("tab:blue", "-"),
    "ddp": ("tab:cyan", "--"),
    "pipe": ("tab:green", "-"),
    "pipe+trunc16": ("tab:olive", "--"),
    "pipe+bf16": ("tab:brown", "-."),
    "pipe+q8": ("tab:purple", ":"),
    "pipe+dc": ("tab:pink", "--"),
    "pipe+dc-adaptive": ("tab:gray", "-."),
    "pipe+predict": ("black", "-"),
    "torch-ddp": ("navy", ":"),
    "torch-pipe": ("darkgoldenrod", ":"),
}
SPARE = ("teal", "maroon", "indigo", "darkorange", "slategray", "yellowgreen")


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or None when matplotlib is missing.

    Agg in a notebook too: `save_figure` displays each figure itself, once, as the PNG it
    wrote, so what a notebook shows is exactly the file a script leaves behind."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no window, works on a machine with no screen
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def method_style(label: str) -> dict:
    """matplotlib keywords (color, linestyle) for the method `label` (METHOD_STYLES)."""
    style: str | tuple[int, tuple[int, ...]]  # a named line style, or (offset, dashes)
    if label in METHOD_STYLES:
        color, style = METHOD_STYLES[label]
    else:
        color, style = SPARE[zlib.crc32(label.encode()) % len(SPARE)], (0, (5, 2, 1, 2))
    return {"color": color, "linestyle": style}


def in_notebook() -> bool:
    """True inside a Jupyter kernel (Jupyter, VS Code, nbconvert/nbclient), where a cell's
    output can hold an image; False in a script or a plain `python`/IPython terminal."""
    if "ipykernel" not in sys.modules:  # never import IPython just to ask
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def save_figure(fig, path: str | Path) -> Path:
    """Lay out, write (120 dpi), close and announce one figure; returns its path. Written
    atomically (a temporary file beside it, then os.replace): a reader, or a run that dies in
    the middle, never sees half a figure. In a notebook the figure is displayed inline too."""
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
    if in_notebook() and path.suffix.lower() == ".png":
        from IPython.display import Image, display

        display(Image(filename=str(path)))
    return path


def figure_formats() -> tuple[str, ...]:
    """The file suffixes matplotlib can write (png, pdf, svg, ...); () without matplotlib."""
    if pyplot() is None:
        return ()
    from matplotlib.backend_bases import FigureCanvasBase

    return tuple(sorted(FigureCanvasBase.get_supported_filetypes()))
