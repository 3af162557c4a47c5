"""The package's version, in a module of its own so that any part (the report, the command line) can import it
without importing the package's public face (``lightning_ig/__init__.py``); ``pyproject.toml`` reads it too."""

__all__ = ["__version__"]

__version__ = "0.1.0"
