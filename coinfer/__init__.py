"""coinfer: what the edge and the cloud both need.

Tasks (prompt format, answer parser, exact grader), declarative rules, the
error kinds shared by both sides, and the generated ``coinfer.v1`` protocol
stubs (``coinfer/v1/*_pb2.py``, made by ``make protos`` from ``protos/``).
"""

__version__ = "0.1.0"
