"""Emulation topologies (JSON data + generators) and the Mininet builder for either target."""
