"""edge: the edge daemon. Drafts with a small ONNX model, streams drafts to the cloud."""
