"""Persisted state (planner estimates, learned scheduler weights) read through a schema.

A file that is unreadable, truncated or of the wrong shape (``{"values": []}``, a weight ``"x"``,
``NaN``) must never stop a service or poison it: it is validated with pydantic on load, and an
invalid one is moved aside (``<name>.invalid-<unix time>``, kept for the operator) with one ERROR
log line; the service starts from its defaults and writes a fresh file on its next save.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)


def load(path: Path | None, schema: type[M]) -> M | None:
    """The file at ``path`` validated as ``schema``; None when there is none or it was set aside."""
    if path is None or not path.is_file():
        return None
    try:
        return schema.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, ValueError, ValidationError) as exc:  # JSONDecodeError is a ValueError
        why = (
            f"{exc.error_count()} schema error(s), first: {exc.errors()[0]['loc']} {exc.errors()[0]['msg']}"
            if isinstance(exc, ValidationError)
            else f"{type(exc).__name__}: {str(exc)[:120]}"
        )
        aside = path.with_name(f"{path.name}.invalid-{int(time.time())}")
        try:
            path.rename(aside)
            where = f"moved to {aside.name}"
        except OSError as err:
            where = f"could not be moved aside ({err.strerror})"
        log.error("%s: invalid state file (%s); %s, starting from defaults", path, why, where)
        return None
