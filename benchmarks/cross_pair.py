"""A draft and a target that share no tokenizer (issue 37 item 3): SmolLM2-135M-Instruct INT8 drafting on
the edge and Gemma 3 270M (base, with ``deploy/chat_templates/gemma.jinja``) verifying and refining on the
cloud's vLLM, and the reverse where the Gemma 3 INT8 edge build is asked for, each plan asked through the
openai SDK on open prompts (``benchmarks.open_prompts``).

Usage::

    python -m benchmarks.cross_pair                                  # SmolLM2 -> Gemma 3, 4 prompts a plan
    python -m benchmarks.cross_pair --directions smollm2-gemma3 gemma3-smollm2 --prompts 8 --json out.json

Per direction and plan: p50 / p90 latency, the answers' sources (draft: a verified draft as is, refined:
the target's refinement, cloud: the target's own answer, edge: the edge alone), the verifier's accept /
reject shares over every draft it judged (drafts it did not score, ``not_scored``, left out), the sessions
where the cloud answered from session open (``hedged``: ``coinfer.cloud.hedge``), and the answers that fell
back past the deadline (the goal: none; split p50 <= 1.5x the cloud plan's). Each request alternates
between a plain and a streamed call. ``--pin`` (the default on two cores or more) keeps the target's engine
and the edge on cores of their own, as two machines would be.

Models: ``coinfer.quantize.real_model`` (pip, no model hub; cached under ``~/.cache/coinfer``). The Gemma 3 edge
build is ``real_model.edge_dir("gemma3")`` read with the Gemma template (``gemma_edge_dir``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.capacity import REAL_MAX_TOKENS
from benchmarks.open_accuracy import add_engine_argument, engine_overrides
from benchmarks.open_prompts import OPEN_PROMPTS
from benchmarks.replica import CLOUD_CORE
from coinfer.cloud.judging import NOT_SCORED

ROOT = Path(__file__).resolve().parents[1]
GEMMA_TEMPLATE = ROOT / "deploy" / "chat_templates" / "gemma.jinja"
PLANS = ("edge", "split", "cloud", "auto")
DIRECTIONS = {"smollm2-gemma3": ("smollm2", "gemma3"), "gemma3-smollm2": ("gemma3", "smollm2")}
"""Direction name -> (edge model, cloud model)."""
TEMPLATE_TOKENS = ("<start_of_turn>", "<end_of_turn>", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<eos>")
"""Either model's turn markers: never in an answer, whichever side wrote it."""
SPLIT_GOAL = 1.5
"""Split's p50 at most this many times the cloud plan's."""

log = logging.getLogger(__name__)


def gemma_edge_dir() -> Path:
    """Gemma 3 270M as the edge runs it (buffer-graph export, default INT8: ``real_model.edge_dir("gemma3")``,
    or the newest such build already in the cache) read with the Gemma template: the build's files with
    ``chat_template.jinja`` added and ``<end_of_turn>`` among its stop ids (what ``quantize export
    --chat-template`` and an import given the template write), its manifest rewritten. The weights are the
    build's, so no second 20-minute export and quantization; cached beside it, keyed by build and template."""
    import hashlib
    import os
    import shutil
    import tempfile

    from tokenizers import Tokenizer

    from coinfer.manifest import MANIFEST, write_manifest
    from coinfer.quantize import real_model as rm

    models = rm.cache_dir() / "models"
    built = sorted(
        (p for p in models.glob("imported-gemma-3-270m-*-int8-*") if (p / MANIFEST).is_file()),
        key=lambda p: p.stat().st_mtime,
    )
    src = built[-1] if built else rm.edge_dir("gemma3")
    template = GEMMA_TEMPLATE.read_text(encoding="utf-8")
    out = models / f"cross-pair-gemma3+chat{hashlib.sha256(template.encode()).hexdigest()[:8]}-{src.name}"
    if (out / MANIFEST).is_file():
        return out
    tmp = Path(tempfile.mkdtemp(dir=models, prefix=".cross-pair-"))
    try:
        for f in src.iterdir():
            if f.is_file() and f.name != MANIFEST:
                os.link(f, tmp / f.name)  # the weights shared, not copied
        (tmp / "chat_template.jinja").write_text(template, encoding="utf-8")
        eot = Tokenizer.from_file(str(src / "tokenizer.json")).token_to_id("<end_of_turn>")
        for name in ("config.json", "generation_config.json"):
            cfg = json.loads((src / name).read_text())
            eos = cfg.get("eos_token_id")
            cfg["eos_token_id"] = [eot] + [e for e in (eos if isinstance(eos, list) else [eos]) if e not in (None, eot)]
            (tmp / name).unlink()  # a link to the build's file: written anew, the build's left as it is
            (tmp / name).write_text(json.dumps(cfg, indent=2))
        meta = json.loads((src / MANIFEST).read_text())
        write_manifest(tmp, {k: v for k, v in meta.items() if k not in ("format", "version", "files")})
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def edge_model(name: str) -> Path:
    """The edge's INT8 build of ``name`` (a chat template of its own: SmolLM2's, Gemma's from the file)."""
    from coinfer.quantize.real_model import edge_dir

    return edge_dir() if name == "smollm2" else gemma_edge_dir()


def cloud_model(name: str) -> tuple[Path, Path | None]:
    """(the cloud's model directory, the chat template file it is served with: None for its own)."""
    from coinfer.quantize.real_model import imported_dir

    return (imported_dir(), None) if name == "smollm2" else (imported_dir("gemma3"), GEMMA_TEMPLATE)


def pin_threads(cpus: set[int]) -> set[int]:
    """Every thread of this process onto ``cpus`` (threads started later inherit it from their creator);
    returns the process's affinity before. ``os.sched_setaffinity(0, ...)`` moves the calling thread only."""
    before = os.sched_getaffinity(0)
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)
    return before


@asynccontextmanager
async def pair(
    edge_dir: Path,
    cloud_dir: Path,
    chat_template: Path | None,
    max_model_len: int = 2048,
    *,
    pin: bool = False,
    dtype: str = "float32",
    engine_fields: dict | None = None,
    **policy,
) -> AsyncIterator[object]:
    """An edge daemon on ``edge_dir`` over a cloud serving ``cloud_dir`` (with ``chat_template``: vLLM's
    ``--chat-template``), once the edge sees the cloud SERVING. Yields the daemon; ``daemon.pair_cloud`` is
    the cloud server. ``pin``: the two machines apart on one box, as ``benchmarks.capacity`` runs them: the
    target's engine process on ``CLOUD_CORE`` (vLLM's OpenMP threads bound there), this process (the edge's
    ORT drafting, one thread, and both daemons' Python) on the other cores. Unpinned, the edge's drafting
    and the target's decoding share every core: a draft round slows the cloud's own answer it races.
    ``engine_fields``: further ``EngineConfig`` fields (``--engine``)."""
    from coinfer.cloud.config import CloudConfig, EngineConfig, PolicyConfig
    from coinfer.cloud.server import create_server
    from coinfer.cloud.vllm_engine import VllmEngine

    # float32: the target's answer under exact split is its own greedy text token for token (quantize.real_model.CLOUD_DTYPE)
    engine = EngineConfig(
        model=str(cloud_dir),
        max_model_len=max_model_len,
        chat_template=str(chat_template or ""),
        dtype=dtype,
        **(engine_fields or {}),
    )
    srv = await create_server(CloudConfig(engine=engine, policy=PolicyConfig(**policy)))
    before = None
    try:
        if pin:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(CLOUD_CORE)  # read by the engine process it starts
        await srv.attach_engine(await VllmEngine(engine).start())
        if pin:
            before = pin_threads({c for c in os.sched_getaffinity(0) if c != CLOUD_CORE})
        async with serving_edge(edge_dir, srv.port, threads=1 if pin else 0) as d:
            d.pair_cloud = srv
            yield d
    finally:
        await srv.stop(grace=1.0)
        if before is not None:
            pin_threads(before)
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)


@asynccontextmanager
async def serving_edge(edge_dir: Path, cloud_port: int, threads: int = 0) -> AsyncIterator[object]:
    """An edge daemon on ``edge_dir`` over the cloud at ``cloud_port``, once its health watch sees SERVING
    (``threads``: ORT's intra-op threads, 0 = every core)."""
    from coinfer.edge.config import EdgeConfig
    from coinfer.edge.daemon import EdgeDaemon

    d = await EdgeDaemon(
        EdgeConfig(model=str(edge_dir), cloud=f"127.0.0.1:{cloud_port}", grpc_port=0, http_port=0, threads=threads)
    ).start()
    try:
        for _ in range(200):
            if d.core.link.serving:
                break
            await asyncio.sleep(0.05)
        yield d
    finally:
        await d.stop()


@dataclass
class Row:
    """One request's outcome."""

    direction: str
    plan: str
    prompt: str
    stream: bool
    latency_s: float
    text: str = ""
    source: str = ""
    plans: list[str] = field(default_factory=list)
    fallback: str = ""
    finish: str = ""
    accepted: int = 0
    """Drafts the cloud's verifier judged valid (rules and likelihood)."""
    rejected: int = 0
    unscored: int = 0
    """Drafts the rules passed and no verifier judged: the cloud answered itself (``coinfer.cloud.hedge``)."""
    refine_mode: str = ""
    taken: int = 0
    """Draft tokens (the target's tokens) the target took under exact verification (``cloud_cost``)."""
    offered: int = 0
    """...of those it checked."""
    trace: str = ""
    """The cloud's account of its choice (``Summary.trace``)."""
    error: str = ""

    @property
    def answered(self) -> bool:
        """An answer from the plan asked (auto: any), with no fallback past the deadline, no template tokens."""
        leaked = any(tok in self.text for tok in TEMPLATE_TOKENS)
        return bool(self.text.strip()) and not self.fallback and not self.error and not leaked


_CLIENTS: dict[tuple[int, int], tuple] = {}


def client(daemon):
    """One openai client per daemon port and event loop (its connection pool belongs to the loop): a client per
    request loaded an SSL context on the loop each time."""
    from openai import AsyncOpenAI

    loop = asyncio.get_running_loop()
    key = (daemon.http_port, id(loop))
    if key not in _CLIENTS:  # the loop kept beside its client: its id is not reused while the entry lives
        _CLIENTS[key] = (loop, AsyncOpenAI(base_url=f"http://127.0.0.1:{key[0]}/v1", api_key="unused", max_retries=0))
    return _CLIENTS[key][1]


async def ask(daemon, direction: str, prompt: str, plan: str, *, stream: bool, max_tokens: int, seed: int = 3) -> Row:
    """``prompt`` as a one-turn chat through the openai SDK, plain or streamed, in ``plan``."""
    import openai

    messages = [{"role": "user", "content": prompt}]
    extra = {"coinfer": {"plan": plan}}
    row = Row(direction, plan, prompt, stream, 0.0)
    t0 = time.perf_counter()
    try:
        if stream:
            parts, info = [], {}
            s = await client(daemon).chat.completions.create(
                model="coinfer-edge", messages=messages, max_tokens=max_tokens, seed=seed, stream=True, extra_body=extra
            )
            async for chunk in s:
                choice = chunk.choices[0]
                parts.append(choice.delta.content or "")
                if choice.finish_reason:
                    row.finish, info = choice.finish_reason, (chunk.model_extra or {}).get("coinfer", {})
            row.text = "".join(parts)
        else:
            r = await client(daemon).chat.completions.create(
                model="coinfer-edge", messages=messages, max_tokens=max_tokens, seed=seed, extra_body=extra
            )
            row.text, row.finish, info = (
                r.choices[0].message.content or "",
                r.choices[0].finish_reason,
                r.model_extra["coinfer"],
            )
    except openai.APIError as exc:
        row.latency_s, row.error = time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"[:300]
        return row
    row.latency_s = time.perf_counter() - t0
    row.source, row.plans, row.fallback = info.get("source", ""), info.get("plans", []), info.get("fallback_reason", "")
    row.refine_mode, row.trace = info.get("refine_mode", ""), info.get("trace", "")
    cost = info.get("cloud_cost", {})
    row.taken, row.offered = cost.get("draft_tokens_accepted", 0), cost.get("draft_tokens_offered", 0)
    verdicts = info.get("verdicts", [])
    row.unscored = sum(1 for v in verdicts if v["error"].startswith(NOT_SCORED))
    row.accepted = sum(1 for v in verdicts if v["valid"])
    row.rejected = len(verdicts) - row.accepted - row.unscored
    return row


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q * 100) - 1] if len(xs) > 1 else (xs or [0.0])[0]


def summarise(rows: list[Row]) -> list[dict]:
    """One line per (direction, plan): latency percentiles, sources, verdict shares, fallbacks."""
    out = []
    for key in dict.fromkeys((r.direction, r.plan) for r in rows):
        rs = [r for r in rows if (r.direction, r.plan) == key]
        lat = [r.latency_s for r in rs]
        judged = sum(r.accepted + r.rejected for r in rs)
        out.append(
            {
                "direction": key[0],
                "plan": key[1],
                "n": len(rs),
                "answered": sum(r.answered for r in rs),
                "fallbacks": sum(bool(r.fallback) for r in rs),
                "errors": sum(bool(r.error) for r in rs),
                "p50_s": round(statistics.median(lat), 2),
                "p90_s": round(pct(lat, 0.9), 2),
                "sources": dict(Counter(r.source or "-" for r in rs)),
                "drafts_judged": judged,
                "drafts_unscored": sum(r.unscored for r in rs),
                "hedged": sum("racing the drafts" in r.trace for r in rs),
                "accept_share": round(sum(r.accepted for r in rs) / judged, 2) if judged else None,
                "reject_share": round(sum(r.rejected for r in rs) / judged, 2) if judged else None,
                "refine_modes": dict(Counter(r.refine_mode or "-" for r in rs)),
                "draft_tokens_taken": sum(r.taken for r in rs),
                "draft_tokens_offered": sum(r.offered for r in rs),
            }
        )
    return out


def goals(lines: list[dict]) -> dict[str, dict]:
    """Per direction: every plan answered every request (no fallback), and split p50 <= 1.5x cloud's."""
    res = {}
    for direction in dict.fromkeys(x["direction"] for x in lines):
        by = {x["plan"]: x for x in lines if x["direction"] == direction}
        ratio = (
            by["split"]["p50_s"] / by["cloud"]["p50_s"] if "split" in by and by.get("cloud", {}).get("p50_s") else None
        )
        res[direction] = {
            "all_answered": all(x["answered"] == x["n"] for x in by.values()),
            "split_over_cloud_p50": round(ratio, 2) if ratio is not None else None,
            "split_goal_met": ratio is not None and ratio <= SPLIT_GOAL,
        }
    return res


def exactness(rows: list[Row]) -> dict[str, dict]:
    """Per direction: of the prompts both split and the cloud plan answered (greedy), how many split answered word
    for word as the cloud plan did (exact verification), and the share of the draft tokens it checked that it took."""
    out = {}
    for direction in dict.fromkeys(r.direction for r in rows):
        cloud = {(r.prompt, r.stream): r.text for r in rows if r.direction == direction and r.plan == "cloud"}
        split = [r for r in rows if r.direction == direction and r.plan == "split" and (r.prompt, r.stream) in cloud]
        offered = sum(r.offered for r in split)
        out[direction] = {
            "compared": len(split),
            "split_equals_cloud": sum(r.text == cloud[(r.prompt, r.stream)] for r in split),
            "draft_tokens_offered": offered,
            "draft_tokens_taken": sum(r.taken for r in split),
            "taken_share": round(sum(r.taken for r in split) / offered, 3) if offered else None,
        }
    return out


def table(lines: list[dict]) -> str:
    head = (
        f"{'direction':16} {'plan':6} {'n':>3} {'ok':>3} {'fb':>3} {'p50 s':>7} {'p90 s':>7} {'accept':>7} "
        f"{'reject':>7} {'hedged':>6}  sources"
    )
    rows = [head, "-" * len(head)]
    for x in lines:
        share = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        srcs = ", ".join(f"{k} {v}" for k, v in sorted(x["sources"].items()))
        rows.append(
            f"{x['direction']:16} {x['plan']:6} {x['n']:>3} {x['answered']:>3} {x['fallbacks']:>3} {x['p50_s']:>7.2f} "
            f"{x['p90_s']:>7.2f} {share(x['accept_share']):>7} {share(x['reject_share']):>7} {x['hedged']:>6}  {srcs}"
        )
    return "\n".join(rows)


async def run_direction(
    direction: str,
    prompts: list[str],
    plans: tuple[str, ...],
    max_tokens: int,
    pin: bool = False,
    engine_fields: dict | None = None,
    **policy,
) -> list[Row]:
    edge_name, cloud_name = DIRECTIONS[direction]
    edge_dir = edge_model(edge_name)
    cloud_dir, template = cloud_model(cloud_name)
    rows: list[Row] = []
    async with pair(edge_dir, cloud_dir, template, pin=pin, engine_fields=engine_fields, **policy) as d:
        await ask(d, direction, "Say hello.", "cloud", stream=False, max_tokens=8)  # the first request's set-up
        for plan in plans:
            await d.pair_cloud.core.engine.reset_prefix_cache()  # each plan starts cold
            for i, prompt in enumerate(prompts):
                row = await ask(d, direction, prompt, plan, stream=bool(i % 2), max_tokens=max_tokens)
                log.info("%s %s %.2f s %s %r", direction, plan, row.latency_s, row.source or row.error, row.text[:60])
                rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cross_pair", description=__doc__.split("\n\n")[0])
    ap.add_argument("--directions", nargs="+", choices=list(DIRECTIONS), default=["smollm2-gemma3"])
    ap.add_argument("--plans", nargs="+", choices=PLANS, default=list(PLANS))
    ap.add_argument("--prompts", type=int, default=4, help="requests per plan (benchmarks.open_prompts, in order)")
    ap.add_argument("--max-tokens", type=int, default=REAL_MAX_TOKENS)
    ap.add_argument(
        "--max-retries",
        type=int,
        help="the cloud's policy.max_retries (default: the policy's): rounds of drafts after one it rejects",
    )
    ap.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=len(os.sched_getaffinity(0)) > 1,
        help="the target's engine on one core, the edge on the others, as two machines would be (default: "
        "where there are two cores)",
    )
    add_engine_argument(ap)
    ap.add_argument("--json", type=Path, help="write the rows, the table and the goals here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in ("vllm", "coinfer"):
        logging.getLogger(name).setLevel(logging.WARNING)
    prompts = (OPEN_PROMPTS * (args.prompts // len(OPEN_PROMPTS) + 1))[: args.prompts]
    rows: list[Row] = []
    engine_fields = engine_overrides(args.engine)
    for direction in args.directions:
        policy = {} if args.max_retries is None else {"max_retries": args.max_retries}
        run = run_direction(
            direction, prompts, tuple(args.plans), args.max_tokens, pin=args.pin, engine_fields=engine_fields, **policy
        )
        rows += asyncio.run(run)
    lines = summarise(rows)
    print(table(lines))
    met = goals(lines)
    for direction, g in met.items():
        print(
            f"{direction}: every request answered: {g['all_answered']}; split p50 / cloud p50 = {g['split_over_cloud_p50']} (goal <= {SPLIT_GOAL})"
        )
    exact = exactness(rows)
    for direction, e in exact.items():
        print(
            f"{direction}: split = cloud plan word for word on {e['split_equals_cloud']} of {e['compared']}; "
            f"draft tokens taken {e['draft_tokens_taken']} of {e['draft_tokens_offered']} checked"
        )
    if args.json:
        out = {
            "pinned": args.pin,
            "table": lines,
            "goals": met,
            "exactness": exact,
            "rows": [asdict(r) for r in rows],
        }
        args.json.write_text(json.dumps(out, indent=2))
    return 0 if all(g["all_answered"] for g in met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
