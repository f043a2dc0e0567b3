"""Host agent: KV tensors to kvpool packets and back, on inference nodes and holders."""
