"""cloud: the cloud gRPC service. Verifies drafts and refines answers on vLLM."""
