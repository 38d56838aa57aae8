"""vLLM's offline engine in one helper process, for tests that only need vLLM to load a model directory and
decode greedily (the six draft families, the demo draft).

Why a helper: each start of the cloud's engine (``AsyncLLM`` behind ``VllmEngine``) spawns an engine-core
process and a worker process, and each imports vLLM again: ~20 s on 2 cores, most of it imports. Here
vLLM is imported once, with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (engine core and worker in this process),
and each model then loads in ~3 s. The engine arguments are the cloud's (``coinfer.cloud.vllm_engine.engine_args``).
The cloud's own engine path is what the session's ``cloud`` fixture, the likelihood tests and the real model's
tests start; this helper replaces only starts that checked "vLLM loads this directory and decodes".

    OfflineVllm().greedy(EngineConfig(model=...), prompt_ids, max_tokens) -> token ids

Run as ``python -m tests.vllm_offline``: one JSON request per stdin line, one ``@@result`` line per reply
on stdout (vLLM logs to stdout too). The process ends when its stdin closes.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

RESULT = "@@result "
ROOT = Path(__file__).resolve().parents[1]


class OfflineVllm:
    def __init__(self) -> None:
        env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.vllm_offline"],
            cwd=ROOT,
            env=env,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def greedy(self, cfg, prompt_ids: list[int], max_tokens: int) -> list[int]:
        """vLLM's greedy continuation of ``prompt_ids`` with the cloud's engine arguments for ``cfg``."""
        from coinfer.cloud.vllm_engine import engine_args

        req = {"args": engine_args(cfg), "prompt_token_ids": prompt_ids, "max_tokens": max_tokens}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(RESULT):
                reply = json.loads(line[len(RESULT) :])
                if "error" in reply:
                    raise RuntimeError(f"vLLM ({cfg.model}): {reply['error']}")
                return reply["token_ids"]
        raise RuntimeError(f"the vLLM helper exited ({self.proc.wait()}) before answering")

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def serve() -> None:
    from vllm import LLM, SamplingParams

    for line in sys.stdin:
        req = json.loads(line)
        llm = None
        try:
            llm = LLM(**req["args"])
            out = llm.generate(
                {"prompt_token_ids": req["prompt_token_ids"]},
                SamplingParams(max_tokens=req["max_tokens"], temperature=0.0),
                use_tqdm=False,
            )
            reply = {"token_ids": list(out[0].outputs[0].token_ids)}
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails with it
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        del llm
        gc.collect()
        print(RESULT + json.dumps(reply), flush=True)


if __name__ == "__main__":
    serve()
