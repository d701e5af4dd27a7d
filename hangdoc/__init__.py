"""hangdoc: tells you why a distributed PyTorch job stopped making progress."""

__version__ = "0.1.0"
SCHEMA_VERSION = 1
