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
        ({"COINFER_EDGE_MODEL": "/m"}, {"plan": "moon"}, "plan: Input should be 'auto', 'edge', 'split' or 'cloud'"),
        ({"COINFER_EDGE_MODEL": "/m"}, {"deadline_ms": 5}, r"deadline_ms: must be in \[100, 600000\], got 5"),
        ({"COINFER_EDGE_MODEL": "/m"}, {"http_body_timeout_s": 0}, r"http_body_timeout_s: must be in \(0, 3600\]"),
        ({"COINFER_EDGE_MODEL": "/m"}, {"max_new_tokens": 5000}, r"max_new_tokens: must be in \[1, 4096\]"),
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


def test_every_declared_bound_refuses_a_value_past_it_at_load_naming_the_field():
    import dataclasses

    from coinfer.serving.bounds import Bound

    bounded = [(f.name, f.metadata["bound"]) for f in dataclasses.fields(EdgeConfig) if "bound" in f.metadata]
    assert {"deadline_ms", "replays", "breaker_failures", "grpc_port", "planner_tau_s"} <= {n for n, _ in bounded}
    for name, b in bounded:
        assert isinstance(b, Bound)
        below = b.ge - 1 if b.ge is not None else b.gt
        with pytest.raises(ValueError, match=f"^{name}: must be in"):
            EdgeConfig.load(None, env={"COINFER_EDGE_MODEL": "/m"}, **{name: below})
        if b.le is not None:
            with pytest.raises(ValueError, match=f"^{name}: must be in"):
                EdgeConfig.load(None, env={"COINFER_EDGE_MODEL": "/m"}, **{name: b.le + 1})


def test_the_plan_is_an_enum_equal_to_its_wire_string():
    from coinfer.edge.kinds import RequestedPlan

    cfg = EdgeConfig.load(None, env={"COINFER_EDGE_MODEL": "/m", "COINFER_EDGE_PLAN": "split"})
    assert cfg.plan is RequestedPlan.SPLIT and cfg.plan == "split"
    direct = EdgeConfig(model="/m", plan="cloud")  # built in code: converted when validated
    direct.validate()
    assert direct.plan is RequestedPlan.CLOUD
