"""Sync: enumerate both sides, filter, compare, decide, transfer, delete (not named `sync`: that is the API)."""
