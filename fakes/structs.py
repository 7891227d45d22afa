"""SGLang request structs per version, and request-body validation faithful to SGLang's FastAPI layer.

The field names, annotation texts, defaults and required-ness come from `snapshots/io_struct-<version>.json`,
written by `scripts/snapshot_io_structs.py` from the released sglang wheels (ast-parsed, never imported). The
snapshots also list each version's HTTP routes and which struct each route takes as its body.

`validate(struct_name, body, profile_version)` does what FastAPI + pydantic v2 (lax mode) do to a JSON body
before SGLang's handler sees it: unknown keys are ignored, defaults are filled, values are type-checked and
coerced against the annotation text, and a failure raises `RequestError(400, <SGLang error body>)` whose
`message` is built the way SGLang's `RequestValidationError` handler builds it (entrypoints/http_server.py):

    {"object": "error", "message": "1 validation error:\\n  {'type': 'missing', 'loc': ('body', 'new_version'),
     'msg': 'Field required', 'input': {}}\\n  ... [{...}]", "type": "Bad Request", "param": null, "code": 400}

Type semantics follow pydantic v2 lax (python) mode, checked value by value against pydantic itself in
`tests/fakes/test_structs.py`: int -> float ok, bool -> int ok (pydantic accepts it: True -> 1), "5"/"5.0"/5.0 ->
int ok, "true"/"yes"/"1"/1/0 -> bool ok, int -> str NOT ok, tuples as lists, unions in smart mode (a strict
match on any member first, then the first lax match), `Optional[X]` is nullable X.

Deviations (documented, deliberate):
  * `bytes` / `Base64Bytes` values are validated (Base64Bytes: `base64.b64decode(v, validate=True)`) but
    returned as received (the base64 string), so the engine decodes them itself on every profile.
  * `Annotated[X, PlainValidator(f)]` is checked by the fake's copy of `f` where it has one (`_PLAIN`: 0.5.23
    `GenerateReqInput.input_ids`), else as X.
  * Names that io_struct imports from another SGLang module are checked where the snapshot resolved them (a type
    alias; `Modality`, a plain `Enum`: a JSON key never matches its int values); the others (`ImageData`, structs
    such as `KvHintsEnvelope`) are `Any`.
  * 0.5.23 checks `/generate` bodies a second time against `sglang.api.v1.GenerateRequest` (the
    "contract gate", 400 `{"error": "<text>"}`); that gate is not modelled here.
  * The body is JSON-decoded whatever the Content-Type (newer FastAPI refuses a body without one).
  * The message follows FastAPI >= 0.120 (`"N validation error(s):\n  {...}\n  File ..." + " [errors]"`; older
    FastAPI gives just `str(errors)`); its `File "...", line N, in handler` context uses the wheel-relative
    path of http_server.py and the handler's first decorator line from the snapshot.
  * A msgspec struct (0.5.15+) refuses a body with its union schema's errors (`_as_union`): an `is_instance_of`
    error first, the others under the `function-after[build_struct(), X]` branch, as real SGLang answers.
  * `__post_init__` effects are applied from `POST_INIT` (AbortReq: `rid=None` -> `""`), not executed.

No import-time I/O: snapshots are read on first use and cached.
"""

from __future__ import annotations

import ast
import base64
import binascii
import copy
import json
import math
import re
import threading
from array import array
from pathlib import Path
from typing import Any, Callable

from .facts import newest_not_newer, parse_version

SNAPSHOT_DIR = Path(__file__).parent / "snapshots"
VALIDATION_ERROR_TYPE = "Bad Request"

# `__post_init__` effects SGLang applies after validation: struct -> {field: (from, to)}.
POST_INIT: dict[str, dict[str, tuple[Any, Any]]] = {"AbortReq": {"rid": (None, "")}}

_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "off", "f", "false", "n", "no"}
_INT_STR = re.compile(r"^([+-]?[0-9](?:_?[0-9])*)(?:\.0+)?$")  # pydantic's str -> int: digits, `_`, a zero fraction


class RequestError(Exception):
    """A request SGLang refuses before the handler runs: `status` and the JSON `body` it answers with."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{status}: {body.get('message', body)}")
        self.status = status
        self.body = body


# ----------------------------------------------------------------------------------------------- snapshots

_lock = threading.Lock()
_snapshots: dict[str, dict[str, Any]] = {}
_compiled: dict[tuple[str, str], Any] = {}


def available_versions() -> list[str]:
    """The sglang versions with a committed snapshot, oldest first."""
    names = [p.name[len("io_struct-") : -len(".json")] for p in SNAPSHOT_DIR.glob("io_struct-*.json")]
    return sorted(names, key=parse_version)


def snapshot(profile_version: str) -> dict[str, Any]:
    """The snapshot for `profile_version`: the exact one, else the newest one not newer than it."""
    with _lock:
        cached = _snapshots.get(profile_version)
    if cached is not None:
        return cached
    versions = available_versions()
    if not versions:
        raise FileNotFoundError(f"no io_struct-*.json snapshots in {SNAPSHOT_DIR}")
    chosen = newest_not_newer(versions, profile_version)
    if chosen is None:
        raise KeyError(f"no snapshot for sglang {profile_version}; have {versions}")
    data = json.loads((SNAPSHOT_DIR / f"io_struct-{chosen}.json").read_text())
    with _lock:
        _snapshots[profile_version] = data
    return data


def has_struct(name: str, profile_version: str) -> bool:
    return name in snapshot(profile_version)["structs"]


def struct_fields(name: str, profile_version: str) -> dict[str, dict[str, Any]]:
    """`{field: {"type", "default", "required", "default_factory"}}` of a struct (a copy)."""
    structs = snapshot(profile_version)["structs"]
    if name not in structs:
        raise KeyError(f"sglang {profile_version} has no struct {name}")
    return copy.deepcopy(structs[name]["fields"])


def endpoints(profile_version: str) -> dict[str, dict[str, Any]]:
    """`{path: {"methods", "struct", "body_required", ...}}`: the routes the real server has (a copy)."""
    return copy.deepcopy(snapshot(profile_version)["endpoints"])


def defaults(name: str, profile_version: str) -> dict[str, Any]:
    """Every non-required field with the value SGLang fills in when it is absent."""
    return {
        fname: _default_value(spec)
        for fname, spec in snapshot(profile_version)["structs"][name]["fields"].items()
        if not spec["required"]
    }


_FACTORY_EMPTY: dict[str, Callable[[], Any]] = {"list": list, "dict": dict, "set": list, "tuple": list,
                                                 "str": str, "int": int, "float": float, "bool": bool}


def _default_value(spec: dict[str, Any]) -> Any:
    """A fresh default: an empty container for a ``default_factory``, a copy of a mutable literal."""
    factory = spec.get("default_factory")
    if factory is not None:
        make = _FACTORY_EMPTY.get(factory.split(".")[-1])
        return make() if make is not None else None
    default = spec["default"]
    return copy.deepcopy(default) if isinstance(default, (list, dict)) else default


# ----------------------------------------------------------------------------------------------- types
# A compiled type is a tuple: ("any",) ("none",) ("str",) ("int",) ("float",) ("bool",) ("bytes", base64)
# ("list", item) ("tuple", items | None, item) ("dict", key, value) ("union", members) ("nullable", inner)
# ("literal", values) ("base64", inner) ("enum", class name, values).

_SCALARS = {"str": ("str",), "int": ("int",), "float": ("float",), "bool": ("bool",), "bytes": ("bytes",),
            "Any": ("any",), "object": ("any",), "None": ("none",), "NoneType": ("none",), "dict": ("dict", ("any",),
            ("any",)), "list": ("list", ("any",)), "tuple": ("tuple", None, ("any",)), "set": ("list", ("any",))}
_SCALARS.update(Dict=_SCALARS["dict"], List=_SCALARS["list"], Tuple=_SCALARS["tuple"], Set=_SCALARS["set"],
                Sequence=_SCALARS["list"], Mapping=_SCALARS["dict"])
_LIST_HEADS = {"List", "list", "Sequence", "Set", "set", "FrozenSet", "Iterable"}
_DICT_HEADS = {"Dict", "dict", "Mapping", "MutableMapping"}


def compiled_type(type_text: str, profile_version: str) -> Any:
    key = (profile_version, type_text)
    found = _compiled.get(key)
    if found is None:
        snap = snapshot(profile_version)
        names: dict[str, Any] = {**snap.get("aliases", {}), **{name: ("enum", e["class"], tuple(e["values"]))
                                                                for name, e in snap.get("enums", {}).items()}}
        found = _compile(ast.parse(type_text, mode="eval").body, names, 0)
        _compiled[key] = found
    return found


def _compile(node: ast.AST, names: dict[str, Any], depth: int) -> Any:
    """A compiled type of an annotation; ``names``: a name's alias text, or its compiled enum."""
    if depth > 40:
        return ("any",)
    if isinstance(node, ast.Constant):
        if node.value is None:
            return ("none",)
        if isinstance(node.value, str):  # a forward reference in quotes
            return _compile(ast.parse(node.value, mode="eval").body, names, depth + 1)
        return ("any",)
    if isinstance(node, ast.Attribute):  # typing.Any, np.ndarray ...
        return _SCALARS.get(node.attr, ("any",))
    if isinstance(node, ast.Name):
        if node.id in _SCALARS:
            return _SCALARS[node.id]
        found = names.get(node.id)
        if isinstance(found, tuple):
            return found
        if found is not None:
            return _compile(ast.parse(found, mode="eval").body, names, depth + 1)
        return ("any",)  # an imported class, numpy array...: not checked
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):  # X | Y
        return _union([_compile(node.left, names, depth + 1), _compile(node.right, names, depth + 1)])
    if not isinstance(node, ast.Subscript):
        return ("any",)
    head = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
    args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
    if head == "Optional":
        return _union([_compile(args[0], names, depth + 1), ("none",)])
    if head == "Union":
        return _union([_compile(a, names, depth + 1) for a in args])
    if head == "Annotated":
        plain = next((name for a in args[1:] for name in _PLAIN if f"PlainValidator({name})" in ast.unparse(a)), None)
        if plain is not None:
            return ("plain", plain)
        inner = _compile(args[0], names, depth + 1)
        if any("Base64Bytes" in ast.unparse(a) for a in args[1:]):
            inner = _mark_base64(inner)
        return inner
    if head == "Literal":
        return ("literal", tuple(ast.literal_eval(a) for a in args))
    if head in _LIST_HEADS:
        return ("list", _compile(args[0], names, depth + 1))
    if head in {"Tuple", "tuple"}:
        if len(args) == 2 and isinstance(args[1], ast.Constant) and args[1].value is Ellipsis:
            return ("tuple", None, _compile(args[0], names, depth + 1))
        return ("tuple", tuple(_compile(a, names, depth + 1) for a in args), None)
    if head in _DICT_HEADS:
        return ("dict", _compile(args[0], names, depth + 1), _compile(args[1], names, depth + 1))
    if head in {"Type", "type", "ClassVar", "Final"}:
        return ("any",)
    return ("any",)


def _union(members: list[Any]) -> Any:
    flat: list[Any] = []

    def add(member: Any) -> None:
        if member[0] == "union":
            for m in member[1]:
                add(m)
        elif member[0] == "nullable":
            add(member[1])
            add(("none",))
        elif member not in flat:
            flat.append(member)

    for member in members:
        add(member)
    rest = [m for m in flat if m != ("none",)]
    if ("any",) in rest:
        return ("any",)
    if not rest:
        return ("none",)
    inner = rest[0] if len(rest) == 1 else ("union", tuple(rest))
    return ("nullable", inner) if ("none",) in flat else inner


def _list_i64_1d(v: Any) -> Any:
    """SGLang's ``validate_list_i64_1d`` (``utils/field_validators.py``, 0.5.23): its checks and messages."""
    if v is None:
        raise ValueError("must not be None")
    if not isinstance(v, list):
        raise ValueError(f"must be list; got {type(v).__name__}")
    if not v:
        return v
    if not isinstance(v[0], int):
        raise ValueError(f"elements must be int; got {type(v[0]).__name__}")
    try:
        array("q", v)
    except (TypeError, OverflowError) as e:
        raise ValueError(f"contains non-int64 element: {e}") from None
    return v


def _optional_list_i64_1d_2d(v: Any) -> Any:
    """SGLang's ``validate_optional_list_i64_1d_2d`` (``utils/field_validators.py``, 0.5.23): None, a list of int64,
    or a list of such lists, checked by its first element."""
    if v is None or (isinstance(v, list) and not v):
        return v
    if not isinstance(v, list):
        raise ValueError(f"must be list or null; got {type(v).__name__}")
    if isinstance(v[0], int):
        return _list_i64_1d(v)
    if isinstance(v[0], list):
        for i, row in enumerate(v):
            try:
                _list_i64_1d(row)
            except ValueError as e:
                raise ValueError(f"row {i}: {e}") from None
        return v
    raise ValueError(f"elements must be int or list; got {type(v[0]).__name__}")


_PLAIN: dict[str, Callable[[Any], Any]] = {"validate_optional_list_i64_1d_2d": _optional_list_i64_1d_2d}
"""The ``PlainValidator`` functions of io_struct the fake runs (by name): a field annotated with one is checked by it
alone, as pydantic does (its ValueError a ``value_error``)."""


def _mark_base64(node: Any) -> Any:
    """`Annotated[X, Base64Bytes()]`: a before-validator decoding str (and lists of str) over the whole field."""
    return ("base64", node)


def type_repr(node: Any) -> str:
    """pydantic's tag for a union member in an error `loc` (e.g. 'str', 'list[str]', 'dict[str,int]')."""
    kind = node[0]
    if kind in {"str", "int", "float", "bool", "bytes", "any", "none"}:
        return {"any": "any", "none": "none"}.get(kind, kind)
    if kind == "list":
        return f"list[{type_repr(node[1])}]"
    if kind == "tuple":
        return f"tuple[{', '.join(type_repr(n) for n in node[1])}]" if node[1] is not None else \
            f"tuple[{type_repr(node[2])}, ...]"
    if kind == "dict":
        return f"dict[{type_repr(node[1])},{type_repr(node[2])}]"
    if kind == "literal":
        return f"literal[{','.join(repr(v) for v in node[1])}]"
    if kind == "enum":
        return f"enum[{node[1]}]"
    if kind == "nullable":
        return f"nullable[{type_repr(node[1])}]"
    if kind == "base64":
        return type_repr(node[1])
    return "union[" + ",".join(type_repr(m) for m in node[1]) + "]"


# ----------------------------------------------------------------------------------------------- checking


def _err(kind: str, loc: tuple, msg: str, value: Any, ctx: dict[str, Any] | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"type": kind, "loc": loc, "msg": msg, "input": value}
    if ctx is not None:
        error["ctx"] = ctx
    return error


def check(node: Any, value: Any, loc: tuple = (), strict: bool = False) -> tuple[Any, list[dict[str, Any]]]:
    """(coerced value, errors) of `value` against a compiled type; errors are pydantic-shaped dicts."""
    kind = node[0]
    if kind == "any":
        return value, []
    if kind == "none":
        return (None, []) if value is None else (value, [_err("none_required", loc, "Input should be None", value)])
    if kind == "nullable":
        return (None, []) if value is None else check(node[1], value, loc, strict)
    if kind == "str":
        if isinstance(value, str):
            return value, []
        if not strict and isinstance(value, bytes | bytearray):
            return bytes(value).decode("utf-8", "replace"), []
        return value, [_err("string_type", loc, "Input should be a valid string", value)]
    if kind == "int":
        return _check_int(value, loc, strict)
    if kind == "float":
        return _check_float(value, loc, strict)
    if kind == "bool":
        return _check_bool(value, loc, strict)
    if kind == "bytes":
        return _check_bytes(value, loc, strict)
    if kind == "base64":
        message = _base64_error(value)
        if message is not None:
            return value, [_err("value_error", loc, f"Value error, {message}", value, {"error": ValueError(message)})]
        _, errors = check(node[1], value, loc, strict)
        return value, errors  # returned as received: the engine decodes it (module docstring)
    if kind == "plain":
        try:
            return _PLAIN[node[1]](value), []
        except ValueError as e:
            return value, [_err("value_error", loc, f"Value error, {e}", value, {"error": e})]
    if kind == "literal":
        for allowed in node[1]:
            if type(allowed) is type(value) and allowed == value:
                return value, []
        expected = _or_join([repr(v) for v in node[1]])
        return value, [_err("literal_error", loc, f"Input should be {expected}", value, {"expected": expected})]
    if kind == "enum":
        return _check_enum(node, value, loc, strict)
    if kind == "list":
        if not isinstance(value, list | tuple) or (strict and not isinstance(value, list)):
            return value, [_err("list_type", loc, "Input should be a valid list", value)]
        out, errors = [], []
        for i, item in enumerate(value):
            v, e = check(node[1], item, loc + (i,), strict)
            out.append(v)
            errors.extend(e)
        return out, errors
    if kind == "tuple":
        if not isinstance(value, list | tuple):
            return value, [_err("tuple_type", loc, "Input should be a valid tuple", value)]
        items = node[1]
        if items is not None and len(items) != len(value):
            n = len(items)
            return value, [_err("too_long" if len(value) > n else "missing", loc,
                                f"Tuple should have at most {n} items after validation, not {len(value)}"
                                if len(value) > n else "Field required", value)]
        out, errors = [], []
        for i, item in enumerate(value):
            v, e = check(items[i] if items is not None else node[2], item, loc + (i,), strict)
            out.append(v)
            errors.extend(e)
        return out, errors
    if kind == "dict":
        if not isinstance(value, dict):
            return value, [_err("dict_type", loc, "Input should be a valid dictionary", value)]
        out_d, errors = {}, []
        for k, item in value.items():
            kk, ek = check(node[1], k, loc + (k, "[key]"), strict)
            vv, ev = check(node[2], item, loc + (k,), strict)
            out_d[kk] = vv
            errors.extend(ek + ev)
        return out_d, errors
    if kind == "union":
        return _check_union(node[1], value, loc, strict)
    raise ValueError(f"unknown compiled type {node!r}")


def _check_enum(node: Any, value: Any, loc: tuple, strict: bool) -> tuple[Any, list[dict[str, Any]]]:
    """A plain ``Enum``: in lax mode a value equal to a member's (``True`` and ``1.0`` are ``1``; a JSON object key,
    always a string, never is an int member's), in strict mode only a member itself, which JSON never gives."""
    _, name, values = node
    if strict:
        return value, [_err("is_instance_of", loc, f"Input should be an instance of {name}", value, {"class": name})]
    member = next((v for v in values if isinstance(value, str) == isinstance(v, str) and value == v), None)
    if member is not None:
        return member, []
    expected = _or_join([repr(v) for v in values])
    return value, [_err("enum", loc, f"Input should be {expected}", value, {"expected": expected})]


def _check_union(members: tuple, value: Any, loc: tuple, strict: bool) -> tuple[Any, list[dict[str, Any]]]:
    for member in members:  # smart mode, first pass: an exact (strict) match wins
        v, e = check(member, value, loc, True)
        if not e:
            return v, []
    if strict:
        return value, [err for m in members for err in _tagged(m, value, loc, True)]
    errors: list[dict[str, Any]] = []
    for member in members:
        v, e = check(member, value, loc, False)
        if not e:
            return v, []
        errors.extend(_retag(e, loc, member))
    return value, errors


def _tagged(member: Any, value: Any, loc: tuple, strict: bool) -> list[dict[str, Any]]:
    return _retag(check(member, value, loc, strict)[1], loc, member)


def _retag(errors: list[dict[str, Any]], loc: tuple, member: Any) -> list[dict[str, Any]]:
    tag = type_repr(member)
    return [dict(e, loc=loc + (tag,) + tuple(e["loc"][len(loc):])) for e in errors]


def _check_int(value: Any, loc: tuple, strict: bool) -> tuple[Any, list[dict[str, Any]]]:
    if isinstance(value, bool):
        if strict:
            return value, [_err("int_type", loc, "Input should be a valid integer", value)]
        return int(value), []
    if isinstance(value, int):
        return value, []
    if strict:
        return value, [_err("int_type", loc, "Input should be a valid integer", value)]
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return value, [_err("finite_number", loc, "Input should be a finite number", value)]
        if abs(value) >= 2**63:  # pydantic-core converts through i64
            return value, [_err("int_parsing_size", loc, "Unable to parse input string as an integer, exceeded "
                                                         "maximum size", value)]
        if value.is_integer():
            return int(value), []
        return value, [_err("int_from_float", loc, "Input should be a valid integer, got a number with a fractional "
                                                   "part", value)]
    if isinstance(value, str):
        match = _INT_STR.match(value.strip())
        if match is not None:
            return int(match.group(1).replace("_", "")), []
        return value, [_err("int_parsing", loc, "Input should be a valid integer, unable to parse string as an "
                                                "integer", value)]
    return value, [_err("int_type", loc, "Input should be a valid integer", value)]


def _check_float(value: Any, loc: tuple, strict: bool) -> tuple[Any, list[dict[str, Any]]]:
    if isinstance(value, bool):
        if strict:
            return value, [_err("float_type", loc, "Input should be a valid number", value)]
        return float(value), []
    if isinstance(value, int | float):
        return float(value), []
    if not strict and isinstance(value, str):
        try:
            return float(value.strip()), []
        except ValueError:
            return value, [_err("float_parsing", loc, "Input should be a valid number, unable to parse string as a "
                                                      "number", value)]
    return value, [_err("float_type", loc, "Input should be a valid number", value)]


def _check_bool(value: Any, loc: tuple, strict: bool) -> tuple[Any, list[dict[str, Any]]]:
    if isinstance(value, bool):
        return value, []
    if strict:
        return value, [_err("bool_type", loc, "Input should be a valid boolean", value)]
    parsing = _err("bool_parsing", loc, "Input should be a valid boolean, unable to interpret input", value)
    if isinstance(value, str):
        lowered = value.lower()
        if lowered in _TRUE:
            return True, []
        if lowered in _FALSE:
            return False, []
        return value, [parsing]
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:  # pydantic-core reads an int for bool through i64
            return value, [_err("bool_type", loc, "Input should be a valid boolean", value)]
        return (bool(value), []) if value in (0, 1) else (value, [parsing])
    if isinstance(value, float) and value in (0.0, 1.0):
        return bool(value), []
    if isinstance(value, float) and value.is_integer() and -(2**63) <= value < 2**63:
        return value, [parsing]
    return value, [_err("bool_type", loc, "Input should be a valid boolean", value)]


def _check_bytes(value: Any, loc: tuple, strict: bool) -> tuple[Any, list[dict[str, Any]]]:
    if isinstance(value, bytes) or (isinstance(value, str) and not strict):
        return value, []  # a str stays a str (module docstring)
    return value, [_err("bytes_type", loc, "Input should be a valid bytes", value)]


def _base64_error(value: Any) -> str | None:
    """Why SGLang's `Base64Bytes._decode_value` (`utils/msgspec_utils.py`, 0.5.23) refuses ``value``, or None (str:
    strict base64; lists/tuples: every item). Only `binascii.Error` becomes "Expected base64-encoded bytes"; a str
    with a non-ASCII character fails `b64decode` with its own `ValueError`, which pydantic reports as it is."""
    if isinstance(value, str):
        try:
            base64.b64decode(value, validate=True)
        except binascii.Error:
            return "Expected base64-encoded bytes"
        except ValueError as error:
            return str(error)
        return None
    if isinstance(value, list | tuple):
        return next((m for m in map(_base64_error, value) if m is not None), None)
    return None


def _or_join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


# ----------------------------------------------------------------------------------------------- validate


def validate(struct_name: str, body: Any, profile_version: str, *, method: str | None = None,
             path: str | None = None) -> dict[str, Any]:
    """The body as SGLang's handler sees it: unknown keys dropped, defaults filled, values coerced.

    `body` is the decoded JSON; pass `NO_BODY` when the request had no body at all. Raises `RequestError(400, ...)` with
    SGLang's body on a validation failure, and `KeyError` if the profile has no such struct (the route does
    not exist there: the app answers 404 itself). `method`/`path` only enrich the error message.
    """
    structs = snapshot(profile_version)["structs"]
    if struct_name not in structs:
        raise KeyError(f"sglang {profile_version} has no struct {struct_name}")
    fields = structs[struct_name]["fields"]
    if body is NO_BODY:
        raise RequestError(400, _error_body([_err("missing", ("body",), "Field required", None)],
                                            struct_name, profile_version, method, path))
    if not isinstance(body, dict):
        if structs[struct_name].get("kind") == "dataclass":
            msg = f"Input should be a dictionary or an instance of {struct_name}"
            error = _err("dataclass_type", ("body",), msg, body, {"class_name": struct_name})
        else:
            error = _err("dict_type", ("body",), "Input should be a valid dictionary", body)
        raise RequestError(400, _error_body(_as_union([error], body, structs[struct_name], struct_name),
                                            struct_name, profile_version, method, path))
    out: dict[str, Any] = {}
    errors: list[dict[str, Any]] = []
    for fname, spec in fields.items():
        if fname not in body:
            if spec["required"]:
                errors.append(_err("missing", ("body", fname), "Field required", body))
            else:
                out[fname] = _default_value(spec)
            continue
        value, errs = check(compiled_type(spec["type"], profile_version), body[fname], ("body", fname))
        out[fname] = value
        errors.extend(errs)
    if errors:
        raise RequestError(400, _error_body(_as_union(errors, body, structs[struct_name], struct_name),
                                            struct_name, profile_version, method, path))
    for fname, (before, after) in POST_INIT.get(struct_name, {}).items():
        if fname in out and out[fname] == before:
            out[fname] = after
    return out


def _as_union(errors: list[dict[str, Any]], body: Any, struct: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """A msgspec struct's errors as pydantic reports them: its schema is the union (left to right) of an instance
    check and the struct built from a typed dict (``msgspec_struct_pydantic_core_schema``,
    ``utils/msgspec_utils.py``, 0.5.15 and 0.5.23), so the instance check's error comes first and every other one
    is located under the typed dict's branch. A dataclass's errors are as they are."""
    if struct.get("kind") != "msgspec":
        return errors
    branch = f"function-after[build_struct(), {name}]"
    return [_err("is_instance_of", ("body", f"is-instance[{name}]"), f"Input should be an instance of {name}", body,
                 {"class": name})] + [{**e, "loc": ("body", branch, *e["loc"][1:])} for e in errors]


class _NoBody:
    def __repr__(self) -> str:
        return "NO_BODY"


NO_BODY: Any = _NoBody()


def decode_body(raw: bytes | None) -> Any:
    """The decoded JSON of a request body, `NO_BODY` if empty; a JSON syntax error raises SGLang's 400."""
    if not raw:
        return NO_BODY
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        pos = getattr(e, "pos", 0)
        reason = getattr(e, "msg", str(e))
        error = _err("json_invalid", ("body", pos), "JSON decode error", {}, {"error": reason})
        raise RequestError(400, {"object": "error", "message": _message([error], None), "type": VALIDATION_ERROR_TYPE,
                                 "param": None, "code": 400}) from None


def validate_raw(struct_name: str, raw: bytes | None, profile_version: str, *, method: str | None = None,
                 path: str | None = None) -> dict[str, Any]:
    """`validate` on the raw request bytes (empty -> "Field required" for the body, bad JSON -> 400)."""
    return validate(struct_name, decode_body(raw), profile_version, method=method, path=path)


def error_body(message: str) -> dict[str, Any]:
    """SGLang's `ErrorResponse` body for a 400 validation error with this message."""
    return {"object": "error", "message": message, "type": VALIDATION_ERROR_TYPE, "param": None, "code": 400}


def _error_body(errors: list[dict[str, Any]], struct_name: str, profile_version: str, method: str | None,
                path: str | None) -> dict[str, Any]:
    context = None
    if path is not None:
        route = snapshot(profile_version)["endpoints"].get(path, {})
        context = (method or (route.get("methods") or ["POST"])[0], path, route.get("handler"), route.get("line"),
                   snapshot(profile_version).get("routes_source", "sglang/srt/entrypoints/http_server.py"))
    return error_body(_message(errors, context))


def _message(errors: list[dict[str, Any]], context: tuple | None) -> str:
    """`f"{str(exc)} {str(exc.errors())}"` as SGLang's handler builds it on FastAPI >= 0.120."""
    head = f"{len(errors)} validation error{'s' if len(errors) != 1 else ''}:\n"
    text = head + "".join(f"  {e}\n" for e in errors)
    if context is not None:
        method, path, handler, line, source = context
        if handler and line:
            text += f'\n  File "{source}", line {line}, in {handler}\n    {method} {path}'
        else:
            text += f"\n  Endpoint: {method} {path}"
    return f"{text.rstrip()} {errors}"
