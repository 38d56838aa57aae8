"""Scenarios with real processes and engines, shared by the tests and the benchmark command lines.

Not installed with the product (like ``benchmarks/`` and ``tests/``): each module here is the code of
one scenario, importable by ``tests/`` and driven from the command line by its ``benchmarks/`` twin.

- ``faults``: the fault campaign (slow clients, kills, hangs, drains; ``python -m benchmarks.faults``);
- ``replicas``: many edges over several cloud replicas with a kill and a rolling restart
  (``python -m benchmarks.replicas``);
- ``planner``: every plan run for real in a matrix of network / edge / cloud conditions
  (``python -m benchmarks.scenarios``); ``netem``: the shaping proxy it puts between edge and cloud;
- ``hostile``: generated hostile inputs against every RPC and endpoint (``python -m benchmarks.hostile``).
"""
