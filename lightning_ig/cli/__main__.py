"""``python -m lightning_ig.cli``: the ``lightning-ig`` command."""

import sys

from lightning_ig.cli import main

__all__: list[str] = []

sys.exit(main())
