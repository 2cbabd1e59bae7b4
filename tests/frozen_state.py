"""A whole object graph as plain, comparable data: what "changes nothing" is checked with."""

from __future__ import annotations

import dataclasses
from collections import deque

import torch


def freeze(obj: object) -> object:
    """Everything reachable from ``obj`` as nested tuples that compare by value *and* order
    (the free queue's order and the order of a hash's holders are state too)."""
    if isinstance(obj, torch.Generator):
        return ("generator", obj.get_state().numpy().tobytes())
    if isinstance(obj, torch.Tensor):
        data = obj.detach().cpu()
        if data.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):  # numpy has no FP8
            data = data.view(torch.uint8)
        return ("tensor", obj.dtype, tuple(obj.shape), data.numpy().tobytes())
    if isinstance(obj, dict):
        items = ("dict", tuple((key, freeze(value)) for key, value in obj.items()))
        if type(obj).__module__.startswith(("course_lib", "tests")) and vars(obj):
            return (type(obj).__name__, items, freeze(vars(obj)))  # a dict with fields
        return items
    if isinstance(obj, list | tuple | deque):
        return (type(obj).__name__, tuple(freeze(value) for value in obj))
    if isinstance(obj, set | frozenset):
        return ("set", frozenset(obj))
    if dataclasses.is_dataclass(obj) or type(obj).__module__.startswith("course_lib"):
        if hasattr(obj, "__dict__"):
            state = vars(obj)
        else:  # slots: a dataclass's fields, or a plain class's slots
            names = ([f.name for f in dataclasses.fields(obj)] if dataclasses.is_dataclass(obj)
                     else type(obj).__slots__)
            state = {name: getattr(obj, name) for name in names}
        return (type(obj).__name__, freeze(state))
    return obj
