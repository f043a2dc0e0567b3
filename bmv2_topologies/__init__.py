"""Emulation: topology files (JSON), the Mininet builder for either target, and the experiments."""
