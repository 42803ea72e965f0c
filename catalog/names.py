"""Names that become path components (dataset, dedup index, model names): one rule, checked
wherever such a name enters, so that `--set dataset=..` cannot point a folder at `$QUIPU_HOME`
itself or anywhere else."""
from __future__ import annotations

import re

from quipu.catalog.errors import UserError

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
RULE = "1-128 letters, digits, '.', '_' or '-', starting with a letter or digit, with no '..'"


class InvalidName(UserError, ValueError):
    """A name that is not a safe single path component (a ValueError: config validators report it
    under the key it came from)."""


def check_name(name: str, what: str = "name") -> str:
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name) or ".." in name:
        raise InvalidName(f"{what} {name!r} is not a safe name: use {RULE}")
    return name


def name_from(text: str) -> str:
    """A safe name made from free text (a folder's name used as the default dataset name)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", text).replace("..", "_").lstrip("._-")[:128]
    return name or "unnamed"
