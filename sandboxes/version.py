"""The package's version, from one source: pyproject.toml, read back from the installed metadata.

Looked up on first use (`sandboxes.__version__`, `kodeagent.__version__`), so that importing the
packages does not pay for `importlib.metadata`.
"""

from __future__ import annotations

import functools

DISTRIBUTION = "kodeagent"  # one distribution carries both packages


@functools.cache
def version() -> str:
    """The installed distribution's version; "0+unknown" for a source tree that was never installed."""
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"
