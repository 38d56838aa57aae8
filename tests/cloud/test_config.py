"""The cloud's configuration refuses, at load, a limit that would refuse every request, naming the field."""

from __future__ import annotations

import pytest

from coinfer.cloud.config import CloudConfig, EngineConfig, Limits
from coinfer.cloud.server import build_parser, load_config


def test_a_limit_that_refuses_every_session_fails_at_load_naming_the_field():
    ap = build_parser()
    with pytest.raises(ValueError, match=r"^limits\.max_sessions: must be in \[1, inf\), got -1$"):
        load_config(ap, ap.parse_args(["--engine.model", "/m", "--limits.max-sessions", "-1"]), env={})


@pytest.mark.parametrize(
    "field, value, msg",
    [
        ("max_prompt_chars", 0, r"must be in \[1, inf\)"),
        ("max_draft_chars", -5, r"must be in \[1, inf\)"),
        ("max_drafts", 0, r"must be in \[1, inf\)"),
        ("max_message_bytes", 0, r"must be in \[1, inf\)"),
        ("max_deadline_ms", 0, r"must be in \[1, inf\)"),
        ("max_sessions_per_edge", -1, r"must be in \[0, inf\)"),
        ("open_timeout_s", 0.0, r"must be in \(0, inf\)"),
    ],
)
def test_each_limit_is_bounded(field, value, msg):
    with pytest.raises(ValueError, match=rf"^limits\.{field}: {msg}"):
        CloudConfig(engine=EngineConfig(model="m"), limits=Limits(**{field: value})).validate()


def test_the_defaults_and_no_per_edge_limit_are_accepted():
    CloudConfig(engine=EngineConfig(model="m")).validate()
    CloudConfig(engine=EngineConfig(model="m"), limits=Limits(max_sessions=1, max_sessions_per_edge=0)).validate()


@pytest.mark.parametrize(
    "field,value,msg",
    [
        ("max_num_seqs", 0, r"must be in \[1, inf\)"),
        ("kv_cache_gib", 0.0, r"must be in \(0, inf\)"),
        ("gpu_memory_utilization", 1.5, r"must be in \(0, 1\]"),
        ("ngram_speculative_tokens", 17, r"must be in \[0, 16\]"),
        ("tensor_parallel_size", 0, r"must be in \[1, 64\]"),
        ("data_parallel_size", 65, r"must be in \[1, 64\]"),
        ("stream_interval", 0, r"must be in \[1, 64\]"),
    ],
)
def test_each_engine_bound_is_declared_on_its_field_and_named(field, value, msg):
    with pytest.raises(ValueError, match=rf"^engine\.{field}: {msg}"):
        CloudConfig(engine=EngineConfig(model="m", **{field: value})).validate()


@pytest.mark.parametrize(
    "engine, msg",
    [
        ({"url": "vllm:8000"}, r"^engine\.url: must be http\(s\)://"),
        ({"url": "http://user:pw@vllm:8000"}, r"^engine\.url: must be"),  # credentials in a URL get logged
        ({"url": "http://vllm:8000", "ca_file": "/etc/ca.pem"}, r"^engine\.ca_file: needs an https://"),
        ({"url": "https://vllm:8000", "ca_file": "/nonexistent/ca.pem"}, r"^engine\.ca_file: .* is not a file"),
        ({"url": "http://vllm:8000", "probe_period_s": 0.0}, r"^engine\.probe_period_s: must be in \(0, 60\]"),
        ({"url": "http://vllm:8000", "connect_retries": 11}, r"^engine\.connect_retries: must be in \[0, 10\]"),
    ],
)
def test_a_remote_engine_that_could_not_be_reached_is_refused_at_load_naming_the_field(engine, msg):
    with pytest.raises(ValueError, match=msg):
        CloudConfig(engine=EngineConfig(model="m", **engine)).validate()


def test_the_servers_url_is_a_flag_and_its_key_is_not(tmp_path):
    ap = build_parser()
    cfg = load_config(ap, ap.parse_args(["/m", "--engine.url", "https://vllm:8000"]), env={})
    assert cfg.engine.remote and cfg.engine.url == "https://vllm:8000" and cfg.engine.model == "/m"
    with pytest.raises(SystemExit):  # a secret on the command line is in every process list
        ap.parse_args(["/m", "--engine.api-key", "s3cret-key-0123456789"])
    env = {"COINFER_CLOUD_ENGINE__API_KEY": "s3cret-key-0123456789"}
    cfg = load_config(ap, ap.parse_args(["/m", "--engine.url", "http://vllm:8000"]), env=env)
    assert cfg.engine.api_key == "s3cret-key-0123456789"
