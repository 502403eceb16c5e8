"""sift: profile a RAG corpus offline, compute only the attention that matters online."""

__version__ = "0.1.0"
