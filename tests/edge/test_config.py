"""Edge config: TOML file < environment < flags; bad values name the setting."""

import pytest

from coinfer.edge.config import EdgeConfig


def test_layers_override_in_order(tmp_path):
    f = tmp_path / "edge.toml"
    f.write_text('[edge]\nmodel = "/m"\nplan = "edge"\nhttp_port = 9000\nwarm = false\n')
    cfg = EdgeConfig.load(f, env={"COINFER_EDGE_HTTP_PORT": "9100", "COINFER_EDGE_WARM": "true"}, plan="split")
    assert (cfg.model, cfg.plan, cfg.http_port, cfg.warm) == ("/m", "split", 9100, True)


@pytest.mark.parametrize(
    "env,kw,msg",
    [
        ({}, {}, "model: a draft model directory is required"),
        ({"COINFER_EDGE_MODEL": "/m", "COINFER_EDGE_HTTP_PORT": "eighty"}, {}, "COINFER_EDGE_HTTP_PORT: expected int"),
        ({"COINFER_EDGE_MODEL": "/m", "COINFER_EDGE_WARM": "maybe"}, {}, "COINFER_EDGE_WARM: expected bool"),
        ({"COINFER_EDGE_MODEL": "/m"}, {"plan": "moon"}, "plan: must be one of"),
        ({"COINFER_EDGE_MODEL": "/m"}, {"deadline_ms": 5}, "deadline_ms"),
        ({"COINFER_EDGE_MODEL": "/m"}, {"token": "t" * 20}, "token: given without a cloud"),
    ],
)
def test_bad_settings_are_named(env, kw, msg):
    with pytest.raises(ValueError, match=msg):
        EdgeConfig.load(None, env=env, **kw)


def test_unknown_keys_and_bad_files(tmp_path):
    f = tmp_path / "edge.toml"
    f.write_text('[edge]\nmodel = "/m"\ncolour = "blue"\n')
    with pytest.raises(ValueError, match="unknown setting"):
        EdgeConfig.load(f, env={})
    f.write_text("[edge\n")
    with pytest.raises(ValueError, match="unreadable config"):
        EdgeConfig.load(f, env={})
