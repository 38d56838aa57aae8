"""One settings system for both daemons: TOML < environment < flags < the caller's values, sections
included, every field a flag documented by its dataclass docstring, bad values named by their source."""

from __future__ import annotations

import pytest

from coinfer.cloud.config import ENV_PREFIX, CloudConfig
from coinfer.cloud.server import build_parser, load_config
from coinfer.serving import settings


def _cloud(argv: list[str], env: dict[str, str], tmp_path, toml: str = ""):
    ap = build_parser()
    if toml:
        (tmp_path / "cloud.toml").write_text(toml)
        argv = argv + ["--config", str(tmp_path / "cloud.toml")]
    return load_config(ap, ap.parse_args(argv), env=env)


def test_every_layer_overrides_the_one_before_sections_included(tmp_path):
    toml = (
        '[cloud]\nport = 7000\ngrace_s = 3.0\n[cloud.engine]\nmodel = "/from-toml"\n'
        "[cloud.policy]\nmin_mean_logprob = -0.9\nrefine_max_tokens = 300\ncloud_candidates = 2\n"
        "[cloud.limits]\nmax_sessions = 10\n"
    )
    env = {
        "COINFER_CLOUD_PORT": "7100",
        "COINFER_CLOUD_POLICY__MIN_MEAN_LOGPROB": "-0.8",
        "COINFER_CLOUD_LIMITS__MAX_SESSIONS": "12",
        "UNRELATED": "x",
    }
    cfg = _cloud(["--policy.min-mean-logprob", "-0.7", "--policy.relative-margin", "null"], env, tmp_path, toml)
    assert isinstance(cfg, CloudConfig) and cfg.engine.model == "/from-toml"
    assert (cfg.port, cfg.grace_s) == (7100, 3.0)  # env over TOML; TOML over the default
    assert cfg.policy.min_mean_logprob == -0.7 and cfg.policy.relative_margin is None  # flags over both
    assert (cfg.policy.refine_max_tokens, cfg.policy.cloud_candidates) == (300, 2)  # the rest of the section kept
    assert cfg.limits.max_sessions == 12 and cfg.limits.max_drafts == 16  # the section's other defaults too


@pytest.mark.parametrize(
    "argv,env,msg",
    [
        (["--engine.model", "/m", "--limits.max-drafts", "many"], {}, "--limits.max-drafts: expected int, got 'many'"),
        (
            ["--engine.model", "/m"],
            {"COINFER_CLOUD_POLICY__CLOUD_TEMPERATURE": "hot"},
            "COINFER_CLOUD_POLICY__CLOUD_TEMPERATURE: expected float",
        ),
        (["--engine.model", "/m", "--policy.verifier", "oracle"], {}, "policy.verifier: must be"),
        ([], {}, "MODEL: the target model directory is required, positional or --engine.model"),
    ],
)
def test_a_bad_value_is_named_by_where_it_came_from(argv, env, msg, tmp_path):
    with pytest.raises(ValueError, match=msg.replace(".", r"\.").replace("(", r"\(")):
        _cloud(argv, env, tmp_path)


def test_unknown_settings_in_a_file_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"unknown setting\(s\): policy\.colour"):
        _cloud(["--engine.model", "/m"], {}, tmp_path, "[cloud.policy]\ncolour = 'blue'\n")


def test_help_lists_every_field_with_its_docstring_and_no_secret_flag():
    text = build_parser().format_help()
    for flag in (
        "--engine.model",
        "--limits.max-sessions-per-edge",
        "--policy.accept-free-text-margin",
        "--heartbeat-timeout-s",
        "--auth-tokens",
    ):
        assert flag in text
    assert "Relative likelihood threshold" in text  # PolicyConfig.relative_margin's docstring
    assert "--auth-tokens AUTH_TOKENS" in text and "--auth-tokens dict" not in text  # a file, never the tokens
    assert settings.field_docs(CloudConfig)["grace_s"].startswith("Graceful shutdown")
    from coinfer.edge.daemon import build_parser as edge_parser

    edge_help = edge_parser().format_help()
    assert "--http-port" in edge_help and "--token-file" in edge_help and "--token " not in edge_help
    assert ENV_PREFIX == "COINFER_CLOUD_"


def test_the_model_is_a_positional_on_both_daemons_as_in_vllm_serve(tmp_path):
    from coinfer.edge.daemon import build_parser as edge_parser
    from coinfer.edge.daemon import load_config as edge_config

    for argv in (["/t"], ["--engine.model", "/t"], ["--model", "/t"], ["/t", "--engine.model", "/t", "--port", "7"]):
        assert _cloud(argv, {}, tmp_path).engine.model == "/t", argv
    # the command line over the environment and the file, as every flag
    assert (
        _cloud(["/t"], {"COINFER_CLOUD_ENGINE__MODEL": "/env"}, tmp_path, '[cloud.engine]\nmodel = "/f"\n').engine.model
        == "/t"
    )
    for argv in (["/a", "--engine.model", "/t"], ["--model", "/a", "--engine.model", "/t"]):
        with pytest.raises(ValueError, match="name different models: give one"):
            _cloud(argv, {}, tmp_path)
    assert "MODEL" in build_parser().format_usage()
    ap = edge_parser()
    for argv in (["/d"], ["--model", "/d"], ["/d", "--model", "/d", "--http-port", "0"]):
        assert edge_config(ap, ap.parse_args(argv), env={}).model == "/d", argv
    with pytest.raises(ValueError, match=r"MODEL '/d' and --model '/e' name different models"):
        edge_config(ap, ap.parse_args(["/d", "--model", "/e"]), env={})
