"""Attention backends behind one interface (see base.py)."""

from .base import AttentionBackend, BlockLayout, causal_block_count

__all__ = ["AttentionBackend", "BlockLayout", "causal_block_count"]
