"""Test-support helpers: a managed Azurite process and a fault-injecting HTTP proxy."""
