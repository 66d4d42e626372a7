"""Storage backends: the seam the engine talks to (base), the registry by URL scheme, and the stores."""
