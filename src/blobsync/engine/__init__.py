"""The asyncio transfer engine: block planning, budgets, retries, per-file upload and the job runner."""
