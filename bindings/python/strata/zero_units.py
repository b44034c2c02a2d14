"""zero_shard's units: which modules' subtrees are gathered and released whole (units=), as
FSDP's fully_shard wraps modules (imported by zero_torch.py)."""

from __future__ import annotations

from torch import nn

_UNITS_USE = ("use None, a module class, a list or tuple of module classes, or a predicate "
              "(name, module) -> bool")


def _unit_classes(units):
    """The classes of units= given as a class or a collection of classes (a list, a tuple, a
    set: any iterable but a string), or None for a predicate; a collection holding anything
    but a class is a TypeError naming the item."""
    if isinstance(units, type):
        return (units,)
    if callable(units) or isinstance(units, (str, bytes)) or not hasattr(units, "__iter__"):
        return None
    classes = tuple(units)
    if not classes:
        raise TypeError(f"units={units!r} names no class: {_UNITS_USE}")
    for item in classes:
        if not isinstance(item, type):
            raise TypeError(f"units={units!r}: {item!r} ({type(item).__name__}) is not a class; "
                            "list module classes, e.g. units=[Block], or pass a predicate "
                            "(name, module) -> bool")
    return classes


def _unit_owners(module: nn.Module, units):
    """{module name: unit module name} for the modules with parameters, and the units' names in
    module order. units=None: every module with parameters of its own; a class, a list or tuple
    of classes, or a predicate (name, module) -> bool: those modules' subtrees (nested units
    apart), the root module holding the rest."""
    named = list(module.named_modules())
    classes = None if units is None else _unit_classes(units)
    if units is None:
        is_unit = lambda name, m: name == "" or any(True for _ in m.parameters(recurse=False))  # noqa: E731
    elif classes is not None:
        is_unit = lambda name, m: name == "" or isinstance(m, classes)  # noqa: E731
    elif callable(units):
        predicate = units
        is_unit = lambda name, m: name == "" or bool(predicate(name, m))  # noqa: E731
    else:
        raise TypeError(f"units={units!r}: {_UNITS_USE}")
    unit_names = {name for name, m in named if is_unit(name, m)}
    owners = {}
    for name, _ in named:
        owner = name
        while owner not in unit_names:
            owner = owner.rpartition(".")[0]
        owners[name] = owner
    return owners
