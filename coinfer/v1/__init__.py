"""Generated protocol stubs for ``coinfer.v1`` (see protos/coinfer/v1/coinfer.proto).

The ``*_pb2*.py`` files here are generated at install time (``make protos``)
and are git-ignored; never edit them by hand.
"""
