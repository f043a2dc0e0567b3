"""Data-plane tests of the kvpool program, run against the model (default) or BMv2."""
