"""quantize: turn a Hugging Face causal LM into an ONNX artefact the edge can trust."""
