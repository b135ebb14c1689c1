"""What runs inside every sandbox: the runner and the files it loads beside it (standard library and
RestrictedPython only). Backends copy this directory into containers and microVMs as it is."""

from pathlib import Path

RUNTIME_DIR = Path(__file__).resolve().parent
"""This directory: the files every backend starts the runner from (or uploads)."""
