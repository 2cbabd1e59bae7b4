"""Stand-ins for the answer key while grading: importable, but unusable.

Inside the grader's sandbox the objects an exercise names as its ``reference`` are replaced
by these stand-ins before any learner code runs (the real code is not in the sandbox at
all). Importing one works, so a notebook's import cells still run, and a library module
that builds one at import time still imports; calling one, or using anything built from
one, raises :class:`GradingUnavailable`, which the grader reports as a use of the
reference implementation.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, NoReturn

WITHHELD = ("is the reference implementation of an exercise being graded: not available "
            "while grading")


class GradingUnavailable(RuntimeError):
    """The course's own implementation of an exercise, used while that exercise is graded."""


def refuse(name: str) -> NoReturn:
    """Raise :class:`GradingUnavailable` for the withheld object ``name``."""
    raise GradingUnavailable(f"{name} {WITHHELD}")


class _WithheldMeta(type):
    """Metaclass of a withheld class: reading a class attribute refuses too."""

    def __getattr__(cls, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        refuse(f"{cls.__withheld__}.{attribute}")


def _refusing() -> Any:
    def method(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
        refuse(type(self).__withheld__)

    return method


_USES = ("__call__", "__iter__", "__len__", "__getitem__", "__setitem__", "__contains__",
         "__bool__", "__int__", "__float__", "__index__", "__eq__", "__lt__", "__le__",
         "__gt__", "__ge__", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
         "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__pow__",
         "__neg__")


def withheld_class(name: str) -> type:
    """A class that can be imported, subclassed and built, but whose objects refuse every use."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        """Accept any arguments: only a use of the object refuses."""

    def __getattr__(self: Any, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        refuse(f"{name}.{attribute}")

    def __repr__(self: Any) -> str:
        return f"<{name}, not available while grading>"

    namespace = {"__init__": __init__, "__getattr__": __getattr__, "__repr__": __repr__,
                 "__hash__": object.__hash__, "__withheld__": name,
                 "__module__": name.rpartition(".")[0]}
    namespace |= {use: _refusing() for use in _USES}
    return _WithheldMeta(name.rpartition(".")[2], (), namespace)


def withheld_function(name: str) -> Any:
    """A function whose result refuses every use (so a module that calls it at import time
    still imports)."""
    result = withheld_class(name)

    def withheld(*args: Any, **kwargs: Any) -> Any:
        return result()

    withheld.__name__ = withheld.__qualname__ = name.rpartition(".")[2]
    withheld.__withheld__ = name  # type: ignore[attr-defined]
    return withheld


def is_withheld(value: Any) -> bool:
    """Whether ``value`` is a stand-in or an object built from one."""
    own = getattr(value, "__dict__", None)
    return "__withheld__" in vars(type(value)) or (
        isinstance(own, dict | MappingProxyType) and "__withheld__" in own)


def module_getattr(module: str) -> Any:
    """A module ``__getattr__`` (PEP 562): every name of a withheld module is a stand-in."""

    def __getattr__(attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return withheld_class(f"{module}.{attribute}")

    return __getattr__
