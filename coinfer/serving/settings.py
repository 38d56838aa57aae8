"""One settings system for both daemons, on pydantic-settings.

A daemon's configuration is a documented dataclass (``EdgeConfig``, ``CloudConfig`` with its
``engine`` / ``limits`` / ``policy`` sections): its defaults and the docstring under each field are
written once, there. From it this module builds the pydantic model that reads, in order, each
overriding the one before:

1. a TOML file (the daemon's table, ``[edge]`` / ``[cloud]``, else the whole file; sections as
   sub-tables: ``[cloud.policy]``),
2. the environment: ``COINFER_EDGE_HTTP_PORT``, ``COINFER_CLOUD_POLICY__MIN_MEAN_LOGPROB`` (``__``
   between a section and its field),
3. command-line flags: ``--http-port``, ``--policy.min-mean-logprob``; ``--help`` lists every field
   with its default and its docstring (``null`` for None, in flags and the environment alike),
4. values the caller passes (a token read from a file).

A bad value is refused naming where it came from (``COINFER_EDGE_HTTP_PORT: expected int, got
'eighty'``; ``--limits.max-drafts: ...``); the dataclass's own ``validate`` then checks the ranges.
Dataclass fields marked ``metadata={"cli": False}`` get no flag (secrets a daemon reads from a file).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import textwrap
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic_settings import BaseSettings, CliSettingsSource, EnvSettingsSource, SettingsConfigDict


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring written under each field of dataclass ``cls`` (what ``--help`` says about it)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs = {}
    for node, after in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


@functools.cache
def model_of(cls: type, prefix: str = "", flags: bool = False) -> type[BaseModel]:
    """The pydantic model mirroring dataclass ``cls`` (sections as sub-models); with ``prefix``, the
    root ``BaseSettings`` whose environment variables start with it; ``flags``: without the fields
    marked ``metadata={"cli": False}`` (what the command line may set)."""
    hints, docs, fields = typing.get_type_hints(cls), field_docs(cls), {}
    for f in dataclasses.fields(cls):
        typ, doc = hints[f.name], docs.get(f.name)
        if flags and not f.metadata.get("cli", True):
            continue
        if dataclasses.is_dataclass(typ):
            sub = model_of(typ, "", flags)
            fields[f.name] = (sub, Field(default_factory=sub, description=doc or typ.__doc__))
            continue
        default = (
            {"default": f.default} if f.default is not dataclasses.MISSING else {"default_factory": f.default_factory}
        )
        fields[f.name] = (typ, Field(description=doc, **default))
    if prefix:
        base: type[BaseModel] = type(
            "_Root",
            (BaseSettings,),
            {
                "model_config": SettingsConfigDict(
                    extra="forbid",
                    env_prefix=prefix,
                    env_nested_delimiter="__",
                    case_sensitive=False,
                    env_parse_none_str="null",
                )
            },
        )
    else:
        base = type("_Section", (BaseModel,), {"model_config": ConfigDict(extra="forbid")})
    return create_model(
        f"{cls.__name__}{'Flags' if flags else 'Settings'}", __base__=base, __doc__=cls.__doc__, **fields
    )


def add_flags(parser: argparse.ArgumentParser, cls: type, prefix: str) -> CliSettingsSource:
    """A flag per field of ``cls`` (``--http-port``, ``--policy.min-mean-logprob``) on ``parser``, with
    its default and docstring in ``--help``. Returns the source that reads them from parsed args."""
    return CliSettingsSource(
        model_of(cls, prefix, flags=True),
        root_parser=parser,
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_avoid_json=True,
        cli_parse_none_str="null",
    )


MODEL_DEST = "model_positional"


def add_model_positional(parser: argparse.ArgumentParser, same_as: str) -> None:
    """A positional ``MODEL``, as in ``vllm serve MODEL``: the same setting as the flag ``same_as``."""
    parser.add_argument(
        MODEL_DEST,
        nargs="?",
        metavar="MODEL",
        help=f"the model to serve, as in `vllm serve MODEL` (also: {same_as}; two that differ are refused)",
    )


def named_model(args: argparse.Namespace, **flags: str | None) -> str | None:
    """The model the positional ``MODEL`` and the ``flags`` that spell the same setting (flag -> value
    given, None when not) name; None when none does. ValueError when two of them name different models:
    neither silently wins."""
    given = {k: v for k, v in ({"MODEL": getattr(args, MODEL_DEST, None)} | flags).items() if v}
    if len(set(given.values())) > 1:
        raise ValueError(
            "MODEL: " + " and ".join(f"{k} {v!r}" for k, v in given.items()) + " name different models: give one"
        )
    return next(iter(given.values()), None)


class _Env(EnvSettingsSource):
    """The environment source over a given mapping (tests; None: ``os.environ``)."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str] | None) -> None:
        self._given = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        if self._given is None:
            return super()._load_env_vars()
        return {k.lower(): v for k, v in self._given.items()}


def _merge(into: dict, more: Mapping, origin: dict, name: Any, path: tuple = ()) -> None:
    """``more`` over ``into``, sections merged field by field; ``origin`` records where each leaf came from."""
    for k, v in more.items():
        if isinstance(v, Mapping) and v and isinstance(into.setdefault(k, {}), dict):
            _merge(into[k], v, origin, name, path + (k,))
        else:
            into[k] = v
            origin[path + (k,)] = name(path + (k,))


def _toml(path: Path, table: str) -> dict:
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: unreadable config: {exc}") from None
    return data.get(table, data)


_EXPECTED = {
    "int_parsing": "int",
    "int_from_float": "int",
    "bool_parsing": "bool",
    "float_parsing": "float",
    "string_type": "str",
    "dict_type": "a table",
    "model_type": "a table",
}


def load(
    cls: type,
    prefix: str,
    table: str,
    path: Path | None = None,
    env: Mapping[str, str] | None = None,
    cli: CliSettingsSource | None = None,
    args: argparse.Namespace | None = None,
    **overrides: Any,
):
    """An instance of dataclass ``cls`` from TOML file ``path`` < the environment (``env``, else
    ``os.environ``) < flags (``cli`` with the parser's ``args``) < ``overrides`` (None values ignored).
    ValueError naming the setting and where it came from. The dataclass's ``validate()`` is the caller's."""
    model = model_of(cls, prefix)
    values: dict = {}
    origin: dict[tuple, str] = {}
    if path is not None:
        _merge(values, _toml(path, table), origin, lambda p: f"{path}: {'.'.join(p)}")
    _merge(values, _Env(model, env)(), origin, lambda p: prefix + "__".join(p).upper())
    if cli is not None and args is not None:
        _merge(values, cli(parsed_args=args)(), origin, lambda p: "--" + ".".join(p).replace("_", "-"))
    _merge(values, {k: v for k, v in overrides.items() if v is not None}, origin, lambda p: ".".join(p))
    try:
        m = model.model_validate(values)
    except ValidationError as exc:
        raise ValueError("; ".join(_message(e, origin) for e in exc.errors())) from None
    return _dataclass(cls, m)


def _message(err: Mapping, origin: Mapping[tuple, str]) -> str:
    loc = tuple(str(x) for x in err["loc"])
    if err["type"] == "extra_forbidden":
        return f"unknown setting(s): {'.'.join(loc)} ({origin.get(loc, '.'.join(loc))})"
    where = next((origin[loc[:i]] for i in range(len(loc), 0, -1) if loc[:i] in origin), ".".join(loc))
    expected = _EXPECTED.get(err["type"])
    return f"{where}: expected {expected}, got {err.get('input')!r}" if expected else f"{where}: {err['msg']}"


def _dataclass(cls: type, m: BaseModel):
    hints = typing.get_type_hints(cls)
    return cls(
        **{
            f.name: _dataclass(hints[f.name], v) if isinstance(v := getattr(m, f.name), BaseModel) else v
            for f in dataclasses.fields(cls)
        }
    )
