"""Conversations and how a model sees them: chat templates, the plain format, refinement prompts.

Each side renders a conversation with *its own* model's chat template (the draft's on the
edge, the target's on the cloud), so draft and target need not share a tokenizer: drafts
travel as text. The template is the Jinja string in the model directory's
``tokenizer_config.json`` (``chat_template``), rendered the way transformers renders it
(sandboxed Jinja, ``trim_blocks`` / ``lstrip_blocks``, ``raise_exception``), so the edge needs
jinja2 but not transformers. A test checks both renderings agree.

A model without a template gets the documented plain format (``PLAIN_FORMAT``) for a plain
prompt (a request's ``prompt``, no ``messages``)::

    <system content>
    <blank line>
    User: <content>
    Assistant: <content>
    User: <content>
    Assistant:

A request in chat form (``messages``: what ``conversation`` returns as a ``Conversation`` with
``chat_form``) to a model without a template is refused (``NoChatTemplate``, an InvalidArgument that
names the model and the fix), as vLLM refuses one: never rendered silently in the plain format. The fix
is a template for the model (``quantize import --chat-template FILE``, ``quantize export --chat-template
FILE``, vLLM's ``--chat-template``).

The rendered text of a template already holds the model's BOS where the template writes it,
so it is tokenized without adding special tokens; plain text is tokenized with them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from functools import lru_cache
from pathlib import Path

from coinfer.errors import InvalidArgument, require

ROLES = ("system", "user", "assistant")
MAX_MESSAGES = 64
PLAIN_FORMAT = "plain: '<system>\\n\\nUser: ...\\nAssistant: ...\\n...Assistant:'"

# The refinement prompt (docs/design.md §2.2, stage 3): the question plus the best verified drafts as
# candidates; the target writes the final answer. ``{question}`` is the last user turn,
# ``{candidates}`` the drafts, each formatted with CANDIDATE_FORMAT and joined by a newline.
# The demo target is trained on exactly this format (demo/train.py).
REFINE_TEMPLATE = (
    "{question}\n\nCandidate solutions (they may contain mistakes):\n{candidates}\nWrite the correct solution."
)
CANDIDATE_FORMAT = "({n}) {text}"


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a conversation."""

    role: str
    """system | user | assistant."""
    content: str


def validate_messages(messages: Sequence[ChatMessage], field: str = "messages", max_chars: int = 1 << 20) -> None:
    """A conversation both sides can render: known roles, text content, the last turn from the user."""
    require(0 < len(messages) <= MAX_MESSAGES, field, f"needs 1..{MAX_MESSAGES} messages, got {len(messages)}")
    total = 0
    for i, m in enumerate(messages):
        require(m.role in ROLES, f"{field}[{i}].role", f"must be one of {', '.join(ROLES)}, got {m.role!r}")
        require(isinstance(m.content, str), f"{field}[{i}].content", "must be a string")
        total += len(m.content)
    require(
        messages[-1].role == "user",
        f"{field}[{len(messages) - 1}].role",
        f"the last message must be the user's, got {messages[-1].role!r}",
    )
    require(messages[-1].content.strip() != "", f"{field}[{len(messages) - 1}].content", "required")
    require(total <= max_chars, field, f"{total} chars > limit {max_chars}")


class Conversation(list):
    """A request's turns (a list of ChatMessage) that remembers whether the request was in chat form."""

    chat_form: bool = False
    """True when the turns are the request's ``messages``; False for a plain prompt made one user turn."""

    def __init__(self, messages=(), chat_form: bool = False) -> None:
        super().__init__(messages)
        self.chat_form = chat_form


class NoChatTemplate(InvalidArgument):
    """A request in chat form to a model without a chat template."""


def conversation(prompt: str, messages: Sequence[ChatMessage] = ()) -> list[ChatMessage]:
    """The request as a conversation: its messages (chat form), else the prompt as one user turn."""
    return Conversation(messages, chat_form=True) if messages else Conversation([ChatMessage("user", prompt)])


def question_of(messages: Sequence[ChatMessage]) -> str:
    """The text a task parses and the refinement restates: the last user turn."""
    return next((m.content for m in reversed(messages) if m.role == "user"), "")


def with_question(messages: Sequence[ChatMessage], question: str) -> list[ChatMessage]:
    """The conversation with its last user turn replaced by ``question`` (history and system kept; chat form
    kept)."""
    out = Conversation(messages, chat_form=getattr(messages, "chat_form", False))
    for i in range(len(out) - 1, -1, -1):
        if out[i].role == "user":
            out[i] = ChatMessage("user", question)
            break
    return out


def refine_question(
    question: str, drafts: Sequence[str], template: str = REFINE_TEMPLATE, candidate: str = CANDIDATE_FORMAT
) -> str:
    """The refinement's user turn: ``question`` plus ``drafts`` as numbered candidates."""
    cands = "\n".join(candidate.format(n=i + 1, text=d.strip()) for i, d in enumerate(drafts))
    return template.format(question=question.strip(), candidates=cands)


def _raise(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


@lru_cache(maxsize=16)
def _compile(source: str):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = _raise
    return env.from_string(source)


@dataclass(kw_only=True, frozen=True)
class ChatFormat:
    """How one model reads a conversation."""

    template: str = ""
    """Jinja chat template; empty = the plain format."""
    bos_token: str = ""
    eos_token: str = ""
    source: str = dataclass_field(default="", compare=False)
    """Where the format was read (the model directory): named in errors."""

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ChatFormat:
        """From ``tokenizer_config.json`` (a separate ``chat_template.jinja`` wins, as in transformers)."""
        d = Path(model_dir)
        cfg_path = d / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        template = cfg.get("chat_template") or ""
        if isinstance(template, list):  # named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), "")
        jinja = d / "chat_template.jinja"
        if jinja.is_file():
            template = jinja.read_text()

        def tok(name: str) -> str:
            v = cfg.get(name) or ""
            return v.get("content", "") if isinstance(v, dict) else v

        return cls(template=template, bos_token=tok("bos_token"), eos_token=tok("eos_token"), source=str(d))

    @property
    def templated(self) -> bool:
        return bool(self.template)

    def require_template(self, messages: Sequence[ChatMessage], field: str = "messages") -> None:
        """NoChatTemplate if ``messages`` is a conversation in chat form and this format has no template (what
        ``render`` checks; a session may check it when it opens, before any work)."""
        if not self.template and getattr(messages, "chat_form", False):
            raise NoChatTemplate(
                f"{field}: the model ({self.source or 'this model'}) has no chat template, so it cannot read a "
                "conversation; send a plain prompt instead, or give the model a template (quantize import / "
                "export --chat-template FILE; vLLM --chat-template FILE)",
                field=field,
            )

    def after_answer(self) -> str:
        """What the template writes right after an assistant's answer ("" without a template): it starts with
        the model's end-of-turn token (``<|im_end|>``, ``<end_of_turn>``), which the cloud scores after a draft
        and stops its generation on, whatever the tokenizer names its eos."""
        if not self.template:
            return ""
        marker = "\x00answer\x00"
        text = self.render([ChatMessage("user", "u"), ChatMessage("assistant", marker)], add_generation_prompt=False)
        return text.split(marker, 1)[1] if marker in text else ""

    def with_template(self, template: str, source: str = "") -> ChatFormat:
        """This format read with ``template`` instead (a template file given to a model: vLLM's
        ``--chat-template``)."""
        return ChatFormat(
            template=template, bos_token=self.bos_token, eos_token=self.eos_token, source=source or self.source
        )

    def render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> str:
        """The model's input text for ``messages`` (ending where the assistant's answer starts). Without a
        template: the plain format, or NoChatTemplate for a conversation in chat form."""
        if not self.template:
            self.require_template(messages)
            return plain(messages, add_generation_prompt)
        return _compile(self.template).render(
            messages=[{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )


def plain(messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> str:
    """The plain format for models without a chat template (see the module docstring)."""
    parts: list[str] = []
    for m in messages:
        if m.role == "system":
            parts.append(m.content.strip() + "\n")
        else:
            parts.append(f"{m.role.capitalize()}: {m.content.strip()}")
    text = "\n".join(parts)
    return text + "\nAssistant:" if add_generation_prompt else text
