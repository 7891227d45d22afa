"""Snapshot SGLang's launch flags (`ServerArgs.add_cli_args`) into `fakes/snapshots/server_args-<label>.json`.

`python -m fakes.launch_server` builds its argument parser from these snapshots, so it accepts exactly the flags
the real `python -m sglang.launch_server` of that release accepts (option strings, aliases, arity, choices,
literal defaults, help) and rejects the rest as SGLang does.

How (the same way as `snapshot_io_structs.py`: the wheel is a zip, read with `ast`, never imported or installed):
* up to 0.5.10, `ServerArgs.add_cli_args` is a long list of `parser.add_argument(...)` calls in
  `sglang/srt/server_args.py`: every call is read (defaults such as `ServerArgs.port` resolved from the dataclass);
* later releases derive most flags from annotated fields (`A[T, "help"]` / `A[T, Arg(...)]`) of `ServerArgs`
  (0.5.15) or of the namespace classes in `sglang/srt/arg_groups/fields/*.py` (0.5.23), as
  `arg_utils.add_cli_args_from_dataclass` does (bool → store_true, list → nargs "+", Literal → choices,
  `no_cli=True` skipped), and add a few by hand with `parser.add_argument`: both are read.

    python scripts/snapshot_server_args.py                         # 0.5.4 0.5.10 0.5.15(.post1) 0.5.23
    python scripts/snapshot_server_args.py --versions 0.5.15=0.5.15.post1 --wheel-dir /tmp/wheels
"""

from __future__ import annotations

import ast
import sys
import zipfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from snapshot_io_structs import _json_literal, snapshot_main  # noqa: E402

SERVER_ARGS = "sglang/srt/server_args.py"
FIELDS_DIR = "sglang/srt/arg_groups/fields/"
DEFAULT_VERSIONS = ("0.5.4", "0.5.10", "0.5.15=0.5.15.post1", "0.5.23")
ZERO_ARG_ACTIONS = {"store_true", "store_false", "store_const", "count", "DeprecatedAction",
                    "DeprecatedStoreTrueAction", "DeprecatedStoreConstAction", "BooleanOptionalAction"}


def _text(node: ast.AST | None) -> Any:
    """A JSON literal when the node is one (help strings, choices, defaults), else its source text."""
    if node is None:
        return None
    ok, value = _json_literal(node)
    if ok:
        return value
    if isinstance(node, ast.JoinedStr):  # f"...{x}..." help text: keep the literal parts, name the holes
        return "".join(v.value if isinstance(v, ast.Constant) else "{" + ast.unparse(v.value) + "}"
                       for v in node.values)
    return {"expr": ast.unparse(node)}


def _option(flags: list[str], dest: str, *, action: str = "store", nargs: Any = None, type_: str | None = None,
            choices: Any = None, default: Any = None, required: bool = False, help_: Any = "",
            extra: dict[str, Any] | None = None) -> dict[str, Any]:
    if nargs is None and action.split(".")[-1] in ZERO_ARG_ACTIONS:
        nargs = 0
    entry = {"flags": flags, "dest": dest, "action": action.split(".")[-1], "nargs": nargs, "type": type_,
             "choices": choices if isinstance(choices, list) else None, "default": default,
             "required": required, "help": help_}
    if extra:
        entry.update(extra)
    return entry


# ----------------------------------------------------------------------------------------------- add_argument calls


def _class_defaults(tree: ast.Module, class_name: str) -> dict[str, Any]:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return {s.target.id: _text(s.value) for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.value is not None}
    return {}


def _resolve_default(node: ast.AST | None, field_defaults: dict[str, Any]) -> Any:
    """`ServerArgs.port` / `_declared_default("port")` → the field's default; else the literal or its text."""
    if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "ServerArgs":
        return field_defaults.get(node.attr, {"expr": ast.unparse(node)})
    if (isinstance(node, ast.Call) and ast.unparse(node.func) == "_declared_default" and node.args
            and isinstance(node.args[0], ast.Constant)):
        return field_defaults.get(node.args[0].value, {"expr": ast.unparse(node)})
    return _text(node)


def add_argument_calls(source: str, field_defaults: dict[str, Any]) -> list[dict[str, Any]]:
    """Every `<x>.add_argument("--flag", ...)` call of a module, in source order."""
    tree = ast.parse(source)
    field_defaults = {**_class_defaults(tree, "ServerArgs"), **field_defaults}
    out = []
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "add_argument"]
    for call in sorted(calls, key=lambda c: (c.lineno, c.col_offset)):
        flags = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not flags or not all(f.startswith("-") for f in flags):
            continue
        kw = {k.arg: k.value for k in call.keywords if k.arg}
        long_flags = [f for f in flags if f.startswith("--")] or flags
        dest = _text(kw["dest"]) if "dest" in kw else long_flags[0].lstrip("-").replace("-", "_")
        action = ast.unparse(kw["action"]) .strip("'\"") if "action" in kw else "store"
        extra = {}
        for key in ("const", "const_value", "new_flag", "error_message", "metavar"):
            if key in kw:
                extra[key] = _text(kw[key])
        out.append(_option(
            flags, dest, action=action, nargs=_text(kw.get("nargs")),
            type_=ast.unparse(kw["type"]) if "type" in kw else None, choices=_text(kw.get("choices")),
            default=_resolve_default(kw.get("default"), field_defaults),
            required=_text(kw.get("required")) is True, help_=_text(kw.get("help")) or "", extra=extra))
    return out


# ----------------------------------------------------------------------------------------------- annotated fields


def _unsubscript(node: ast.AST) -> tuple[str, list[ast.AST]]:
    """(`Optional`, [X]) for `Optional[X]`; (`name`, []) for a bare name."""
    if isinstance(node, ast.Subscript):
        inner = node.slice
        return ast.unparse(node.value), list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]
    return ast.unparse(node), []


def _strip_optional(node: ast.AST) -> ast.AST:
    """`_unwrap_optional`: Optional[X] / Union[X, None] → X (only when one non-None member is left)."""
    head, args = _unsubscript(node)
    if head in ("Optional", "typing.Optional") and len(args) == 1:
        return args[0]
    if head in ("Union", "typing.Union"):
        rest = [a for a in args if ast.unparse(a) != "None"]
        if len(rest) == 1:
            return rest[0]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [s for s in (node.left, node.right) if ast.unparse(s) != "None"]
        if len(sides) == 1:
            return sides[0]
    return node


def _field_option(name: str, annotation: ast.AST, default: ast.AST | None) -> dict[str, Any] | None:
    """What `add_cli_args_from_dataclass` registers for one `A[T, meta]` field (None: no CLI)."""
    head, args = _unsubscript(annotation)
    if head not in ("A", "Annotated") or len(args) < 2:
        return None
    meta: dict[str, ast.AST] = {}
    help_node: ast.AST | None = None
    for m in args[1:]:
        if isinstance(m, ast.Call) and ast.unparse(m.func) == "Arg":
            meta = {k.arg: k.value for k in m.keywords if k.arg}
            help_node = meta.get("help")
            break
        if isinstance(m, (ast.Constant, ast.JoinedStr)) and not (isinstance(m, ast.Constant)
                                                                 and not isinstance(m.value, str)):
            help_node = m
            break
    else:
        return None
    if _text(meta.get("no_cli")) is True:
        return None
    cli_name = _text(meta["cli_name"]) if "cli_name" in meta else "--" + name.replace("_", "-")
    aliases = _text(meta.get("aliases")) or []
    flags = [cli_name, *aliases]
    value = _text(default) if default is not None else None
    required = default is None and (_text(meta.get("required")) is not False)
    common = dict(help_=_text(help_node) or "", default=value)
    choices = _text(meta.get("choices"))
    if "action" in meta:
        kwargs = meta.get("action_kwargs")
        nargs = None
        if isinstance(kwargs, ast.Dict):  # {"type": str, "nargs": "*"}
            nargs = next((_text(v) for k, v in zip(kwargs.keys, kwargs.values) if _text(k) == "nargs"), None)
        return _option(flags, name, action=ast.unparse(meta["action"]), nargs=nargs, **common)
    inner = _strip_optional(args[0])
    inner_head, inner_args = _unsubscript(inner)
    if inner_head in ("Literal", "typing.Literal"):
        literals = [_text(a) for a in inner_args]
        type_ = type(literals[0]).__name__ if literals else "str"
        return _option(flags, name, type_=type_, choices=choices or literals, **common)
    if inner_head in ("list", "List", "typing.List") and "type_parser" not in meta:
        elem = ast.unparse(inner_args[0]) if inner_args else "str"
        return _option(flags, name, nargs=_text(meta.get("nargs")) or "+",
                       type_=elem if elem in ("int", "float") else "str", choices=choices, **common)
    if inner_head == "bool":
        return _option(flags, name, action="store_true", **common)
    type_ = ast.unparse(meta["type_parser"]) if "type_parser" in meta else (
        inner_head if inner_head in ("int", "float") else "str")
    return _option(flags, name, nargs=_text(meta.get("nargs")), type_=type_, choices=choices,
                   required=required and _text(meta.get("required")) is not False, **common)


def annotated_fields(sources: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(options, field defaults) of `ServerArgs` (0.5.15) and every `_NS_PATH` namespace class (0.5.23)."""
    options: dict[str, dict[str, Any]] = {}  # a field declared twice in one class: the last one wins
    defaults: dict[str, Any] = {}
    for source in sources:
        for node in ast.parse(source).body:
            if not isinstance(node, ast.ClassDef):
                continue
            if node.name != "ServerArgs" and not any(
                    isinstance(s, ast.Assign) and any(ast.unparse(t) == "_NS_PATH" for t in s.targets)
                    for s in node.body):
                continue
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    if stmt.value is not None:
                        defaults[stmt.target.id] = _text(stmt.value)
                    option = _field_option(stmt.target.id, stmt.annotation, stmt.value)
                    options.pop(stmt.target.id, None)
                    if option is not None:
                        options[stmt.target.id] = option
    return list(options.values()), defaults


# ----------------------------------------------------------------------------------------------- main


def snapshot(label: str, version: str, wheel: Path) -> dict[str, Any]:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        server_args = zf.read(SERVER_ARGS).decode("utf-8")
        field_files = sorted(n for n in names if n.startswith(FIELDS_DIR) and n.endswith(".py"))
        field_sources = [zf.read(n).decode("utf-8") for n in field_files]
    from_fields, field_defaults = annotated_fields([server_args, *field_sources])
    options = from_fields + add_argument_calls(server_args, field_defaults)
    seen: dict[str, str] = {}
    for option in options:
        for flag in option["flags"]:
            if flag in seen:
                raise SystemExit(f"{wheel.name}: {flag} registered twice ({seen[flag]}, {option['dest']})")
            seen[flag] = option["dest"]
    return {
        "sglang_version": version,
        "label": label,
        "wheel": wheel.name,
        "sources": [SERVER_ARGS, *field_files],
        "generated_by": "scripts/snapshot_server_args.py (ast parse of the released wheel; never imported)",
        "options": options,
    }


def main(argv: list[str] | None = None) -> int:
    return snapshot_main(argv, __doc__.split("\n\n")[0], "server_args", snapshot,
                         lambda data: f"{len(data['options'])} options from {data['wheel']}")


if __name__ == "__main__":
    raise SystemExit(main())
