"""Sync: enumerate both sides, filter, compare, and decide what to transfer or delete."""
