"""A matplotlib backend for sandboxes: draws with Agg, and `plt.show()` saves PNG files.

There is no display in a sandbox, so showing a figure means writing it where the agent can see it:
the working directory, whose new files come back as artifacts. Each shown figure is saved as
``figure_<n>.png`` (the first free number, so earlier plots are never overwritten) and closed, like
an inline notebook backend: calling `plt.show()` twice does not save the same figure twice.

Selected by the image's matplotlibrc (``backend: module://kodeagent_mpl_backend``) and MPLBACKEND.
"""

from __future__ import annotations

import os
from typing import Any

from matplotlib._pylab_helpers import Gcf
from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg

FigureCanvas = FigureCanvasAgg
FigureManager = FigureManagerBase

_DPI = 100


def _free_name() -> str:
    number = 1
    while os.path.exists(f"figure_{number}.png"):
        number += 1
    return f"figure_{number}.png"


def show(*args: Any, **kwargs: Any) -> None:
    """Save every open figure as figure_<n>.png in the working directory, then close them."""
    for manager in Gcf.get_all_fig_managers():
        manager.canvas.figure.savefig(_free_name(), format="png", dpi=_DPI)
    Gcf.destroy_all()
