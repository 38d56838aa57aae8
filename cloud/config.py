"""Cloud service configuration: one documented dataclass, defaults that run on CPU."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EngineConfig:
    """The vLLM engine serving both verification scoring and refinement."""

    model: str = ""
    """Hugging Face model directory of the target model (required)."""
    max_model_len: int = 256
    """Context length; the demo models are trained to 256 positions."""
    dtype: str = "float32"
    """Weights/activations dtype. float32 on CPU for exact tiny models; bfloat16/float16 on GPU."""
    max_num_seqs: int = 64
    """Most sequences one engine step batches (continuous batching across sessions)."""
    kv_cache_gib: float = 1.0
    """CPU KV cache size (VLLM_CPU_KVCACHE_SPACE); ignored on GPU."""
    gpu_memory_utilization: float = 0.85
    """Fraction of GPU memory vLLM may take; ignored on CPU."""
    enforce_eager: bool = True
    """Skip graph capture / compilation: seconds faster to start on CPU."""
    seed: int = 0

    def validate(self) -> None:
        if not self.model:
            raise ValueError("engine.model: a target model directory is required")
        if not 16 <= self.max_model_len <= 1 << 20:
            raise ValueError(f"engine.max_model_len: must be in 16..1048576, got {self.max_model_len}")
        if self.dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise ValueError(f"engine.dtype: must be float32|bfloat16|float16|auto, got {self.dtype!r}")


@dataclass
class Limits:
    """Per-request limits; over a limit -> RESOURCE_EXHAUSTED naming it."""

    max_prompt_chars: int = 2048
    max_draft_chars: int = 4096
    max_drafts: int = 16
    """Drafts per session across all rounds."""
    max_sessions: int = 64
    """Concurrent sessions; one more is refused."""
    max_message_bytes: int = 4 << 20
    max_deadline_ms: int = 600_000


@dataclass
class PolicyConfig:
    """Verification, scheduling and refinement policy (seed 003, 2.2 and 3.1-4.4)."""

    a: float = 1.0
    """Weight of the verifier score in the scheduler score."""
    b: float = 0.3
    """Weight of agreement, 1 - std of scores across drafts."""
    g: float = 0.02
    """Latency weight (per second of verification)."""
    min_support: int = 2
    """Drafts that must share a step for it to join the consensus prefix."""
    consensus_prefix: bool = True
    """Start the refinement from the valid drafts' consensus steps (seed 4.4)."""
    prefix_min_score: float = 0.9
    """...but only when the best draft's verifier score reaches this (see session.py)."""
    context_drafts: int = 2
    """Best valid drafts used as refinement context."""
    max_retries: int = 2
    """Retry rounds advised to the edge before the cloud drafts itself."""
    refine_temperature: float = 0.0
    """Refinement is greedy by default: the tasks have one exact answer (the seed's 0.7
    is for open-ended prose)."""
    refine_max_tokens: int = 512
    cloud_candidates: int = 4
    """When the cloud answers itself and its greedy answer fails the rules: sampled
    candidates (one batched request) checked against the rules; 0 disables."""
    cloud_temperature: float = 0.7
    default_deadline_ms: int = 60_000


@dataclass
class CloudConfig:
    """Everything the cloud service needs."""

    engine: EngineConfig = field(default_factory=EngineConfig)
    limits: Limits = field(default_factory=Limits)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a free port (tests); the chosen port is returned by create_server."""
    grace_s: float = 10.0
    """Graceful shutdown: in-flight sessions get this long to finish."""
