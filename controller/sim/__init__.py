"""Trace-driven cluster simulator: replays prefix-reuse traces over a modelled cluster.

Three phases per run: ``locality`` routes requests and plays the node-local tiers (policy
independent, so one pass serves every switch policy); ``caches`` replays the resulting
chunk-fetch sequence through a switch-pool policy (the reuse-value engine or a baseline);
``timing`` turns hits and misses into link queues, coalescing, incast and TTFT.
"""
