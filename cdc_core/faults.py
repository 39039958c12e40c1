"""Named points in the code where tests make things happen at exactly the wrong moment.

`point(name)` does nothing unless a test hooked `name` (`hooked`): then it runs the hook, in
line. Points are placed where a race decides correctness, so tests reproduce the race instead
of hoping for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

_hooks: dict[str, Callable[[], None]] = {}


def point(name: str) -> None:
    hook = _hooks.get(name)
    if hook is not None:
        hook()


@contextlib.contextmanager
def hooked(name: str, hook: Callable[[], None]) -> Iterator[None]:
    """Run `hook` at point `name` while the block runs (in this process)."""
    _hooks[name] = hook
    try:
        yield
    finally:
        _hooks.pop(name, None)
