"""What the campaign sends: hypothesis strategies, one module per level.

``values``: hostile values (sizes at and past every limit, special text, extreme numbers, deep nesting);
``inputs``: what the parsers and rules see (prompts, drafts, regexes, schemas, rules, problems);
``wire``: any protobuf message built from the descriptors, hand-written and mutated wire bytes;
``calls``: the generated gRPC and HTTP calls (``GrpcCall``, ``HttpCall``).
"""
