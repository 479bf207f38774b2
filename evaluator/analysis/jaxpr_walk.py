"""The jaxprs nested in an equation's parameters: the one place that knows their two shapes.

Loop bodies, cond branches and called functions arrive as a ClosedJaxpr (a jaxpr plus consts)
or as an open Jaxpr, alone or in tuples. Every walker of a traced program (the structure and
cost analysis, the interval analysis, provenance, the replay) goes through these two helpers.
"""
from __future__ import annotations

from typing import Any, Iterator


def is_closed_jaxpr(item: Any) -> bool:
    return hasattr(item, "jaxpr") and hasattr(item, "consts")


def is_jaxpr(item: Any) -> bool:
    return hasattr(item, "eqns") and hasattr(item, "invars")


def param_jaxprs(params: dict[str, Any]) -> Iterator[Any]:
    """Every ClosedJaxpr or Jaxpr among the parameter values, as found."""
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if is_closed_jaxpr(item) or is_jaxpr(item):
                yield item


def sub_jaxprs(eqn: Any) -> Iterator[Any]:
    """The open jaxprs inside an equation (loop bodies, cond branches, called functions)."""
    for item in param_jaxprs(eqn.params):
        yield item.jaxpr if is_closed_jaxpr(item) else item
