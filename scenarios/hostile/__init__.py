"""Hostile inputs, generated: a hypothesis-driven fuzz campaign against every RPC and
endpoint of a real cloud (vLLM) and a real edge daemon (ONNX Runtime drafts, gRPC + HTTP).

    .venv/bin/python -m benchmarks.hostile [--examples 10000] [--seed 0] [--out docs/faults/hostile.json]

The campaign and its report are described in ``campaign``. The modules, each importing only those
above it:

- ``strategies``: what is sent (hypothesis strategies over messages, wire bytes, HTTP bodies);
- ``targets``: where it goes and what each answer means (senders, classification, ``run_target``);
- ``liveness``: the probes every 20 ms from their own process, and ``alive`` after the campaign;
- ``servers``: the cloud and the edge as subprocesses, their stderr in ``cloud.log`` / ``edge.log``;
- ``stalls``: the event-loop stalls the servers logged (``coinfer.serving.loopwatch``), per target;
- ``campaign``: ``campaign()``, ``summary()`` (the command line: ``benchmarks/hostile.py``).
"""

from scenarios.hostile.campaign import campaign, run, summary
from scenarios.hostile.liveness import Prober, alive, probe_report
from scenarios.hostile.servers import Servers
from scenarios.hostile.stalls import parse_stalls, stall_report
from scenarios.hostile.strategies.calls import GrpcCall, HttpCall
from scenarios.hostile.targets import Clients, Endpoints, Outcome, Tally, Target, run_target, targets, verdict

__all__ = [
    "Clients",
    "Endpoints",
    "GrpcCall",
    "HttpCall",
    "Outcome",
    "Prober",
    "Servers",
    "Tally",
    "Target",
    "alive",
    "campaign",
    "parse_stalls",
    "probe_report",
    "run",
    "run_target",
    "stall_report",
    "summary",
    "targets",
    "verdict",
]
