"""Test-only code the package carries: torchtitan.testing.faults, the environment-driven fault hooks."""
