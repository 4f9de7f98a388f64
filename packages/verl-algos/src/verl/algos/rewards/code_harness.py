"""The harness that runs a model's program inside the sandbox (standard library only: this file's
text is the start of every program the code reward runs, followed by one call of :func:`main`).

It never decides whether a test passed. It runs the program as ``__main__``, then the test steps
the trainer planned (:mod:`.code_judge`): setup statements, and *probes*, expressions whose values
the trainer needs (``f(2)`` in ``assert f(2) == 4``, or the call of ``fn_name``). Each value is
written to standard output as a record line (``@@verl-judge@@`` + JSON), with the tags that keep
tuples, sets and dicts apart, and the trainer compares it with what it expects. The expected values
never enter this process, so a program can pass only by producing them: rewriting its exit path
(``sys.excepthook``, ``atexit``, ``os._exit(0)``), monkeypatching ``assert`` or builtins, killing
this harness or printing record lines of its own gives it, at best, the power to report values of
its choosing, which any program has anyway by returning them.
"""

import base64
import builtins
import json
import os
import sys
import traceback
import types

MARKER = "@@verl-judge@@"
#: Deeper values are refused (the trainer decodes them recursively).
MAX_DEPTH = 100
# Taken now, before the program can replace them.
_write = os.write
_dumps = json.dumps
_stdout = sys.stdout


def encode(value, depth=0):
    """JSON for ``value``: scalars as themselves, containers tagged (``{"t": [...]}`` a tuple,
    ``{"s": ...}`` a set, ``{"fs": ...}`` a frozenset, ``{"d": [[k, v], ...]}`` a dict, ``{"b": ...}``
    bytes, ``{"c": [re, im]}`` a complex, ``{"i": hex}`` a very large int)."""
    if depth > MAX_DEPTH:
        raise ValueError(f"the value is nested more than {MAX_DEPTH} levels deep")
    if value is None or value is True or value is False:
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        number = int.__index__(value)
        return number if number.bit_length() < 10000 else {"i": hex(number)}
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, complex):
        return {"c": [value.real, value.imag]}
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (bytes, bytearray)):
        return {"b": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, list):
        return [encode(v, depth + 1) for v in list.__iter__(value)]
    if isinstance(value, tuple):
        return {"t": [encode(v, depth + 1) for v in tuple.__iter__(value)]}
    if isinstance(value, frozenset):
        return {"fs": [encode(v, depth + 1) for v in frozenset.__iter__(value)]}
    if isinstance(value, set):
        return {"s": [encode(v, depth + 1) for v in set.__iter__(value)]}
    if isinstance(value, dict):
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in dict.items(value)]}
    raise TypeError(
        f"a value of type {type(value).__name__}, which the judge cannot compare outside the program "
        "(only None, bool, int, float, complex, str, bytes, list, tuple, set, frozenset and dict are)"
    )


def record(*fields):
    try:
        _stdout.flush()  # the program's own output first, so that the order is kept
    except BaseException:
        pass
    data = ("\n" + MARKER + _dumps(list(fields)) + "\n").encode()
    while data:
        data = data[_write(1, data) :]


def fail(step, error):
    record("error", step, f"{type(error).__name__}: {error}"[:2000])
    traceback.print_exception(type(error), error, error.__traceback__, file=sys.__stderr__)
    sys.__stderr__.flush()
    os._exit(1)


def main(program, spec):
    """Run ``program`` as ``__main__``, then the planned steps; record each probe's value."""
    module = types.ModuleType("__main__")
    module.__file__ = "program.py"
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    namespace = module.__dict__
    try:
        exec(compile(program, "program.py", "exec"), namespace)
    except SystemExit as e:
        if e.code not in (None, 0):
            fail("program", e)
    except BaseException as e:
        fail("program", e)
    record("ran")
    for index, step in enumerate(spec["steps"]):
        try:
            if "exec" in step:
                exec(compile(step["exec"], f"<test step {index}>", "exec"), namespace)
                continue
            if "call" in step:
                name = step["call"]
                function = namespace.get(name)
                if function is None and "Solution" in namespace:
                    function = getattr(namespace["Solution"](), name)
                if function is None:
                    raise NameError(f"the program defines no function or Solution method named {name!r}")
                value = function(*step["args"])
            else:
                value = eval(compile(step["probe"], f"<test step {index}>", "eval"), namespace)
            record("value", index, encode(value))
        except BaseException as e:
            fail(index, e)
    try:
        _stdout.flush()
    except BaseException:
        pass
