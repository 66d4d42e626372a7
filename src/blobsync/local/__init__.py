"""Local file access: walking trees, identifying files, and reading blocks off the event loop."""
