"""Optimal-stopping policies for Best-of-N sampling (numpy and scipy only).

Every policy is a :class:`StoppingPolicy`: feed rewards with ``observe`` and stop when it
returns True.
"""

from stoppers.base import PolicyStoppedError, StoppingPolicy

__all__ = ["PolicyStoppedError", "StoppingPolicy"]
