"""decodecliff: the long-context MLA verify-decode study."""

__version__ = "0.1.0"
