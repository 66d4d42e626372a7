"""Storage backends: the interface the engine talks to, and its Azure implementation."""
