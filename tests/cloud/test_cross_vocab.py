"""A target that does not share the draft model's vocabulary or chat template (issue 37 item 3), without a
model: a draft's token count and mean logprob restated in the target's tokens, the target's template from a
file (``--chat-template``), and a conversation the target cannot read refused when the session opens. The
real pair (SmolLM2 drafting, Gemma 3 verifying): tests/integration/test_cross_pair.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from coinfer import types as t
from coinfer.chat import ChatFormat, ChatMessage, NoChatTemplate, conversation
from coinfer.cloud.config import CloudConfig, EngineConfig, Limits
from coinfer.cloud.engine import restated
from coinfer.cloud.server import build_parser, load_config
from coinfer.cloud.session import DraftsDone, Session
from coinfer.cloud.vllm_common import chat_format
from coinfer.errors import InvalidArgument
from coinfer.rules import RuleSet
from coinfer.tasks import OPEN
from tests.cloud.engines import ScriptedEngine

ROOT = Path(__file__).resolve().parents[2]
GEMMA = ROOT / "deploy" / "chat_templates" / "gemma.jinja"


def test_a_draft_is_restated_in_the_targets_tokens_keeping_its_total_logprob():
    d = t.Draft(index=0, text="The capital of France is Paris.", num_tokens=9, mean_logprob=-0.4)
    r = restated(d, 6)  # a larger vocabulary: fewer tokens for the same text
    assert r.num_tokens == 6 and r.mean_logprob == pytest.approx(-0.4 * 9 / 6)
    assert r.text == d.text and d.num_tokens == 9  # a copy; the edge's draft is left as it came
    assert restated(d, 9) == d  # one vocabulary on both sides: nothing moves
    unreported = t.Draft(index=1, text="x", num_tokens=3, mean_logprob=0.0)  # proto3's unset float: no own logprob
    assert restated(unreported, 5).mean_logprob == 0.0 and restated(unreported, 5).num_tokens == 5
    assert restated(t.Draft(index=2, text="", num_tokens=0), 1).num_tokens == 0  # nothing counted: as it came


def test_the_gemma_template_writes_gemmas_turns_with_the_system_at_the_head_of_the_first_user_turn():
    fmt = ChatFormat(template=GEMMA.read_text(), bos_token="<bos>", eos_token="<eos>")
    msgs = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi"), ChatMessage("assistant", "Hello")]
    text = fmt.render([*msgs, ChatMessage("user", "Why?")])
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
        "<start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n"
    )
    assert fmt.after_answer() == "<end_of_turn>\n"  # the end of turn the cloud scores and stops on
    assert ChatFormat().after_answer() == ""


def _model_dir(tmp_path: Path, template: str = "") -> Path:
    d = tmp_path / "base-model"
    d.mkdir()
    cfg = {"bos_token": "<bos>", "eos_token": "<eos>"} | ({"chat_template": template} if template else {})
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


def test_a_template_file_is_how_the_target_reads_conversations_and_a_bad_one_fails_at_load(tmp_path):
    d = _model_dir(tmp_path)
    assert not chat_format(EngineConfig(model=str(d))).templated  # a base model: none of its own
    fmt = chat_format(EngineConfig(model=str(d), chat_template=str(GEMMA)))
    assert fmt.templated and fmt.bos_token == "<bos>" and str(GEMMA) in fmt.source
    assert fmt.render([ChatMessage("user", "Hi")]).endswith("<start_of_turn>model\n")
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}")
    with pytest.raises(ValueError, match=r"engine.chat_template: .*bad.jinja: not a usable chat template"):
        EngineConfig(model=str(d), chat_template=str(bad)).validate()
    with pytest.raises(ValueError, match="engine.chat_template: .*missing.jinja"):
        EngineConfig(model=str(d), chat_template=str(tmp_path / "missing.jinja")).validate()


def test_the_cloud_takes_vllms_chat_template_flag(tmp_path):
    d = _model_dir(tmp_path)
    ap = build_parser()
    cfg = load_config(ap, ap.parse_args([str(d), "--chat-template", str(GEMMA)]), env={})
    assert cfg.engine.chat_template == str(GEMMA) and cfg.engine.model == str(d)
    cfg = load_config(ap, ap.parse_args([str(d), "--engine.chat-template", str(GEMMA)]), env={})
    assert cfg.engine.chat_template == str(GEMMA)
    assert load_config(ap, ap.parse_args([str(d)]), env={}).engine.chat_template == ""


class _Counting(ScriptedEngine):
    """A stand-in with a vocabulary of its own: one token per word, and its end of turn."""

    def in_target_tokens(self, d: t.Draft) -> t.Draft:
        return restated(d, self.count_tokens(d.text) + (not d.truncated))


def _session(engine, req: t.OpenRequest, **kw) -> Session:
    return Session(
        cfg=CloudConfig(limits=Limits(max_drafts=4)),
        engine=engine,
        req=req,
        task=OPEN,
        spec={},
        rules=RuleSet([], OPEN, {}),
        recommended_drafts=3,
        deadline_s=10.0,
        **kw,
    )


def test_a_chat_form_request_to_a_target_without_a_template_is_refused_when_the_session_opens():
    msgs = [ChatMessage("user", "What is the capital of France?")]
    req = t.OpenRequest(request_id="r", task="", prompt="", messages=msgs)
    with pytest.raises(NoChatTemplate, match="has no chat template") as err:
        _session(ScriptedEngine({}, reply="Paris."), req)  # ChatFormat(): no template
    assert isinstance(err.value, InvalidArgument)  # INVALID_ARGUMENT to the edge, 400 to its client
    # the same question as a plain prompt is the plain format's
    _session(ScriptedEngine({}, reply="Paris."), t.OpenRequest(request_id="r", task="", prompt=msgs[0].content))
    assert conversation("", msgs).chat_form


def test_a_conversation_the_targets_template_refuses_is_the_requests_error_at_open():
    eng = ScriptedEngine({}, reply="Paris.")
    eng.chat = ChatFormat(template="{{ raise_exception('roles must alternate') }}", source="strict")
    req = t.OpenRequest(request_id="r", task="", prompt="", messages=[ChatMessage("user", "Hi")])
    with pytest.raises(InvalidArgument, match="strict.*refuses this conversation: roles must alternate"):
        _session(eng, req)


async def test_the_verifier_reads_the_drafts_own_logprob_per_target_token():
    # the draft model wrote 12 tokens at -0.4 each (-4.8 in all); the target reads the text as 4 words and an
    # end of turn, at -1.0 each (-5.0): about as likely as the draft model found it, so valid (floor -0.96 -
    # 0.5). Compared per token as the edge counted them (-1.0 < -0.4 - 0.5), the same text failed
    text = "Paris is the capital."
    eng = _Counting({text: [-1.0] * 5}, reply="Paris.")
    s = _session(eng, t.OpenRequest(request_id="r", task="", prompt="What is the capital of France?"))

    async def inbox():
        yield t.Draft(index=0, text=text, num_tokens=12, mean_logprob=-0.4)
        yield DraftsDone(1)

    events = [ev async for ev in s.run(inbox())]
    verdict = next(ev for ev in events if isinstance(ev, t.Verdict))
    assert verdict.valid, verdict
    assert s.judge.judged[0].draft.num_tokens == 5  # budgets read the target's count too
