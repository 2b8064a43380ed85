"""A griffe extension for the docs site: Sphinx cross-reference roles in docstrings as code spans.

The docstrings name other objects the Sphinx way (``:func:`calibrate```, ``:class:`~mixprec.policy.Policy```);
Markdown has no such roles, so each becomes a code span with the name as written (``calibrate``) or, after
``~``, its last part (``Policy``). mkdocs.yml loads this file through mkdocstrings' ``extensions`` option.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|meth|class|mod|attr|data|exc|obj|const):`(~?)([^`]+)`")


def _code(match: re.Match[str]) -> str:
    name = match.group(2)
    return f"`{name.rsplit('.', 1)[-1] if match.group(1) else name}`"


class SphinxRoles(griffe.Extension):
    """Rewrites the roles in every docstring griffe loads."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_code, obj.docstring.value)
