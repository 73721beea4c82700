"""A package's API is what its ``__init__`` imports: :func:`public_names` lists it once, for ``__all__``."""
from __future__ import annotations
import __future__

from collections.abc import Mapping
from types import ModuleType
from typing import Any


def public_names(namespace: Mapping[str, Any]) -> list[str]:
    """The public names a package ``__init__`` holds: what it imported for its API, sorted.

    Submodules (bound as attributes when imported) and ``from __future__`` features are left out.

    Args:
        namespace: The ``__init__``'s ``globals()``.

    Returns:
        The names for its ``__all__``.
    """
    return sorted(name for name, value in namespace.items() if not name.startswith("_")
                  and not isinstance(value, (ModuleType, __future__._Feature)))
