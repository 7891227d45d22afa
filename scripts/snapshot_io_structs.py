"""Snapshot SGLang's HTTP request structs and routes into `fakes/snapshots/io_struct-<version>.json`.

The fake validates request bodies against these snapshots (`fakes/structs.py`), so its field names, types,
defaults and required-ness are SGLang's own, per released version.

How: `pip download sglang==X --no-deps` (a wheel is a zip; it is never installed — sglang needs CUDA), read
`sglang/srt/managers/io_struct.py` and `sglang/srt/entrypoints/http_server.py` out of the zip and parse them with
`ast` (never imported). For every kept class: bases, field names, annotation text, default (a JSON literal via
`ast.literal_eval` when possible, `field(default_factory=...)` noted), required; base-class fields (e.g. `rid`,
`http_worker_ipc` from `BaseReq`) are resolved in. A name io_struct imports from another SGLang module is read
there too (re-exports followed): a type alias joins `aliases`, a plain `Enum` gives its values in `enums`
(`Modality`, whose keys no JSON body can match); any other stays in `external_names` only. For every route: path,
methods, the body struct (if any), whether the body is required, and simple query parameters.

    python scripts/snapshot_io_structs.py                       # 0.5.4 0.5.10 0.5.15 0.5.23 into fakes/snapshots/
    python scripts/snapshot_io_structs.py --versions 0.5.15=0.5.15.post1 --wheel-dir /tmp/wheels --out fakes/snapshots

A version is `VERSION` or `LABEL=VERSION`: the snapshot is named by the label (the fake's profile, e.g. `0.5.15`) and
records the exact release it was read from (`0.5.15.post1`, the build a major framework pins).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Callable

IO_STRUCT = "sglang/srt/managers/io_struct.py"
HTTP_SERVER = "sglang/srt/entrypoints/http_server.py"
DEFAULT_VERSIONS = ("0.5.4", "0.5.10", "0.5.15=0.5.15.post1", "0.5.23")

# The request structs the fake serves (or may serve). Names are SGLang's own: the disk struct is
# `UpdateWeightFromDiskReqInput` (singular "Weight"), the others are `UpdateWeights...`.
KEPT_STRUCTS = (
    "GenerateReqInput",
    "UpdateWeightVersionReqInput",
    "PauseGenerationReqInput",
    "ContinueGenerationReqInput",
    "UpdateWeightFromDiskReqInput",
    "UpdateWeightsFromDistributedReqInput",
    "UpdateWeightsFromTensorReqInput",
    "UpdateWeightsFromIPCReqInput",
    "InitWeightsUpdateGroupReqInput",
    "DestroyWeightsUpdateGroupReqInput",
    "BeginWeightUpdateReqInput",
    "EndWeightUpdateReqInput",
    "LoadLoRAAdapterReqInput",
    "UnloadLoRAAdapterReqInput",
    "LoadLoRAAdapterFromTensorsReqInput",
    "AbortReq",
    "GetWeightsByNameReqInput",
    "FlushCacheReqInput",
    "ReleaseMemoryOccupationReqInput",
    "ResumeMemoryOccupationReqInput",
)

FIELD_FUNCS = {"field", "dataclasses.field", "msgspec.field"}
ROUTE_METHODS = {"get": ["GET"], "post": ["POST"], "put": ["PUT"], "delete": ["DELETE"], "patch": ["PATCH"]}


# ----------------------------------------------------------------------------------------------- download


def download_wheel(version: str, wheel_dir: Path) -> Path:
    """The sglang wheel for `version` in `wheel_dir`, downloaded with pip when missing."""
    found = sorted(wheel_dir.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", f"sglang=={version}", "--no-deps", "-d", str(wheel_dir)]
    subprocess.run(cmd, check=True)
    found = sorted(wheel_dir.glob(f"sglang-{version}-*.whl"))
    if not found:
        raise SystemExit(f"pip download sglang=={version} produced no wheel in {wheel_dir}")
    return found[0]


def parse_versions(specs: list[str]) -> list[tuple[str, str]]:
    """`["0.5.15=0.5.15.post1", "0.5.23"]` → `[("0.5.15", "0.5.15.post1"), ("0.5.23", "0.5.23")]` (label, version)."""
    return [tuple(spec.split("=", 1)) if "=" in spec else (spec, spec) for spec in specs]  # type: ignore[misc]


def read_from_wheel(wheel: Path, member: str) -> str | None:
    with zipfile.ZipFile(wheel) as zf:
        try:
            return zf.read(member).decode("utf-8")
        except KeyError:
            return None


# ----------------------------------------------------------------------------------------------- structs


def _dotted(node: ast.AST) -> str:
    return ast.unparse(node)


def _json_literal(node: ast.AST) -> tuple[bool, Any]:
    """(ok, value): the node as a JSON-able literal."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return False, None

    def to_json(v: Any) -> Any:
        if isinstance(v, tuple | list):
            return [to_json(x) for x in v]
        if isinstance(v, dict):
            return {str(k): to_json(x) for k, x in v.items()}
        if v is None or isinstance(v, bool | int | float | str):
            return v
        raise TypeError(type(v))

    try:
        return True, to_json(value)
    except TypeError:
        return False, None


def _field_spec(annotation: ast.AST, value: ast.AST | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": ast.unparse(annotation), "default": None, "required": True, "default_factory": None}
    if value is None:
        return spec
    default_node: ast.AST | None = value
    if isinstance(value, ast.Call) and _dotted(value.func) in FIELD_FUNCS:
        default_node = None
        for kw in value.keywords:
            if kw.arg == "default":
                default_node = kw.value
            elif kw.arg == "default_factory":
                spec["default_factory"] = ast.unparse(kw.value)
                spec["required"] = False
        if default_node is None:
            return spec
    spec["required"] = False
    ok, literal = _json_literal(default_node)
    if ok:
        spec["default"] = literal
    else:
        spec["default_expr"] = ast.unparse(default_node)
    return spec


def _class_kind(node: ast.ClassDef) -> str:
    decorators = {ast.unparse(d).split("(")[0] for d in node.decorator_list}
    if decorators & {"dataclass", "dataclasses.dataclass"}:
        return "dataclass"
    if any(ast.unparse(b).startswith("msgspec.Struct") for b in node.bases):
        return "msgspec"
    return "class"


def _own_fields(node: ast.ClassDef) -> dict[str, dict[str, Any]]:
    fields: dict[str, dict[str, Any]] = {}
    for stmt in node.body:
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        text = ast.unparse(stmt.annotation)
        if text.startswith(("ClassVar", "typing.ClassVar")):
            continue
        fields[stmt.target.id] = _field_spec(stmt.annotation, stmt.value)
    return fields


def _has_method(node: ast.ClassDef, name: str) -> bool:
    return any(isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name == name for s in node.body)


def parse_io_struct(source: str) -> tuple[dict[str, ast.ClassDef], dict[str, str], dict[str, str]]:
    """(classes, aliases, imported names) of the module, by name."""
    tree = ast.parse(source)
    classes: dict[str, ast.ClassDef] = {}
    aliases: dict[str, str] = {}
    imported: dict[str, str] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef):
            classes[stmt.name] = stmt
        elif isinstance(stmt, ast.Assign):
            text = ast.unparse(stmt.value)
            for target in stmt.targets:
                if isinstance(target, ast.Name) and target.id[:1].isupper():
                    aliases[target.id] = text
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            if ast.unparse(stmt.annotation).endswith("TypeAlias"):
                aliases[stmt.target.id] = ast.unparse(stmt.value)
        elif isinstance(stmt, ast.ImportFrom):
            for alias in stmt.names:
                imported[alias.asname or alias.name] = f"{stmt.module}.{alias.name}"
        elif isinstance(stmt, ast.If):  # `if TYPE_CHECKING: ... else: Image = Any`
            for sub in stmt.body + stmt.orelse:
                if isinstance(sub, ast.Assign):
                    for target in sub.targets:
                        if isinstance(target, ast.Name):
                            aliases.setdefault(target.id, ast.unparse(sub.value))
                elif isinstance(sub, ast.ImportFrom):
                    for alias in sub.names:
                        imported.setdefault(alias.asname or alias.name, f"{sub.module}.{alias.name}")
    return classes, aliases, imported


def resolve_struct(name: str, classes: dict[str, ast.ClassDef]) -> dict[str, Any]:
    """A class's snapshot entry, base-class fields resolved (bases first, like dataclass/msgspec ordering)."""
    node = classes[name]
    bases = [ast.unparse(b) for b in node.bases]
    fields: dict[str, dict[str, Any]] = {}
    for base in node.bases:
        base_name = ast.unparse(base)
        if base_name in classes:
            inherited = resolve_struct(base_name, classes)["fields"]
            for fname, spec in inherited.items():
                fields[fname] = dict(spec, declared_in=spec.get("declared_in", base_name))
    for fname, spec in _own_fields(node).items():
        fields[fname] = spec
    kind = _class_kind(node)
    if kind == "class":  # a subclass of a dataclass / msgspec base keeps the base's kind
        kinds = {resolve_struct(b, classes)["kind"] for b in bases if b in classes}
        kind = next(iter(kinds - {"class"}), "class")
    entry: dict[str, Any] = {"bases": bases, "kind": kind, "fields": fields}
    if _has_method(node, "__post_init__"):
        entry["has_post_init"] = True
    return entry


def _names_in(type_text: str) -> set[str]:
    try:
        tree = ast.parse(type_text, mode="eval")
    except SyntaxError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


TYPING_NAMES = {
    "Optional", "Union", "List", "Dict", "Tuple", "Any", "Literal", "Annotated", "Type", "str", "int", "float",
    "bool", "bytes", "dict", "list", "tuple", "None", "object", "set", "Set", "Sequence",
}


def collect_aliases(structs: dict[str, Any], aliases: dict[str, str], imported: dict[str, str]) -> tuple[dict, dict]:
    """Aliases and external names referenced (transitively) by the kept structs' annotations."""
    used_aliases: dict[str, str] = {}
    external: dict[str, str] = {}
    todo = [spec["type"] for s in structs.values() for spec in s["fields"].values()]
    while todo:
        for name in _names_in(todo.pop()):
            if name in TYPING_NAMES or name in used_aliases or name in external or name in structs:
                continue
            if name in aliases:
                used_aliases[name] = aliases[name]
                todo.append(aliases[name])
            else:
                external[name] = imported.get(name, "<unresolved>")
    return dict(sorted(used_aliases.items())), dict(sorted(external.items()))


def _enum_values(node: ast.ClassDef) -> list[Any] | None:
    """The member values of a plain ``Enum`` class (``auto()`` counting on from 1 as ``Enum`` does), or None when the
    class is not one or a value is not a literal."""
    if not any(ast.unparse(b).split(".")[-1] == "Enum" for b in node.bases):  # IntEnum, StrEnum: other semantics
        return None
    values: list[Any] = []
    for stmt in node.body:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            continue
        if stmt.targets[0].id.startswith("_"):
            continue
        if isinstance(stmt.value, ast.Call) and ast.unparse(stmt.value.func).split(".")[-1] == "auto":
            last = values[-1] if values else 0
            if not isinstance(last, int):
                return None
            values.append(last + 1)
            continue
        ok, literal = _json_literal(stmt.value)
        if not ok:
            return None
        values.append(literal)
    return values


def resolve_external(external: dict[str, str], read: Callable[[str], str | None]) -> tuple[dict, dict]:
    """(aliases, enums) of the names io_struct imports from SGLang's own modules (``read``: a module's source by
    wheel path, or None), re-exports followed: a module-level type alias whose names are all typing's, and a plain
    ``Enum``'s member values (``{"class": name, "values": [...]}``). Any other name stays unresolved (the fake takes
    any value for it)."""
    aliases: dict[str, str] = {}
    enums: dict[str, dict[str, Any]] = {}
    for name, dotted in external.items():
        for _ in range(5):  # re-export hops
            module, _, attr = dotted.rpartition(".")
            if not module.startswith("sglang."):
                break
            source = read(module.replace(".", "/") + ".py") or read(module.replace(".", "/") + "/__init__.py")
            if source is None:
                break
            classes, module_aliases, imported = parse_io_struct(source)
            if attr in module_aliases:
                if _names_in(module_aliases[attr]) <= TYPING_NAMES:
                    aliases[name] = module_aliases[attr]
                break
            if attr in classes:
                values = _enum_values(classes[attr])
                if values is not None:
                    enums[name] = {"class": attr, "module": module, "values": values}
                break
            if attr not in imported:
                break
            dotted = imported[attr]
    return dict(sorted(aliases.items())), dict(sorted(enums.items()))


# ----------------------------------------------------------------------------------------------- routes


def _route_decorators(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[str, list[str]]]:
    routes = []
    for dec in fn.decorator_list:
        if not isinstance(dec, ast.Call) or not isinstance(dec.func, ast.Attribute):
            continue
        if ast.unparse(dec.func.value) != "app":
            continue
        kind = dec.func.attr
        if kind not in ROUTE_METHODS and kind != "api_route":
            continue
        if not dec.args:
            continue
        path_node = dec.args[0]
        ok, path = _json_literal(path_node)
        if not ok:  # os.environ.get("X", "/api/chat") -> the default
            if isinstance(path_node, ast.Call) and len(path_node.args) == 2:
                ok, path = _json_literal(path_node.args[1])
            if not ok:
                continue
        if kind == "api_route":
            methods = ["GET"]
            for kw in dec.keywords:
                if kw.arg == "methods":
                    ok, methods = _json_literal(kw.value)
        else:
            methods = ROUTE_METHODS[kind]
        routes.append((path, sorted(methods)))
    return routes


def _unwrap_body_annotation(text: str) -> tuple[str | None, bool]:
    """(struct name, optional) from `X`, `Annotated[X, Body()]`, `Annotated[Optional[X], Body()]`, `Optional[X]`."""
    tree = ast.parse(text, mode="eval").body
    optional = False
    while isinstance(tree, ast.Subscript):
        head = ast.unparse(tree.value)
        inner = tree.slice
        if head == "Annotated":
            tree = inner.elts[0] if isinstance(inner, ast.Tuple) else inner
        elif head == "Optional":
            optional, tree = True, inner
        else:
            return None, optional
    return (tree.id if isinstance(tree, ast.Name) else None), optional


def parse_routes(source: str, struct_names: set[str]) -> dict[str, Any]:
    tree = ast.parse(source)
    endpoints: dict[str, Any] = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        routes = _route_decorators(fn)
        if not routes:
            continue
        args = fn.args.args
        defaults = [None] * (len(args) - len(fn.args.defaults)) + list(fn.args.defaults)
        body_struct, body_required, query = None, False, {}
        for arg, default in zip(args, defaults):
            if arg.annotation is None:
                continue
            text = ast.unparse(arg.annotation)
            if text in {"Request", "Response", "WebSocket", "fastapi.Request", "Request = None"}:
                continue
            name, optional = _unwrap_body_annotation(text)
            is_query = isinstance(default, ast.Call) and ast.unparse(default.func) == "Query"
            if name in struct_names or (name and name.endswith(("ReqInput", "Req", "Request")) and not is_query):
                if body_struct is None:
                    body_struct = name
                    body_required = default is None and not optional
                continue
            if default is None or is_query or isinstance(default, ast.Constant):
                qdefault = None
                if is_query and default.args:
                    ok, qdefault = _json_literal(default.args[0])
                elif isinstance(default, ast.Constant):
                    qdefault = default.value
                query[arg.arg] = {"type": text, "default": qdefault}
        first_line = min([d.lineno for d in fn.decorator_list] + [fn.lineno])  # what FastAPI reports
        handler: dict[str, Any] = {"handler": fn.name, "line": first_line, "struct": body_struct}
        if body_struct is not None:
            handler["body_required"] = body_required
        if query:
            handler["query"] = query
        if _raises_404(fn):
            handler["always_404"] = True
        if "generate_contract_error" in {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}:
            # 0.5.23: the body is also checked against sglang.api.v1.api_types.GenerateRequest (not modelled)
            handler["contract_gate"] = "sglang.api.v1.api_types.GenerateRequest"
        for path, methods in routes:
            entry = endpoints.get(path)
            if entry is None:
                endpoints[path] = dict(methods=methods, **handler)
                continue
            # two handlers on one path (e.g. GET/PUT/DELETE /hicache/storage-backend): keep each by method
            per_method = entry.pop("per_method", None) or {
                m: {k: v for k, v in entry.items() if k != "methods"} for m in entry["methods"]
            }
            for m in methods:
                per_method[m] = handler
            merged_methods = sorted(per_method)
            first = per_method.get("POST") or per_method[merged_methods[0]]
            endpoints[path] = dict(methods=merged_methods, **first, per_method=per_method)
    return dict(sorted(endpoints.items()))


def _raises_404(fn: ast.AST) -> bool:
    """The handler's only job is raising HTTPException(404) (the 0.5.10 `/get_weight_version` deprecation)."""
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Raise) or not isinstance(body[0].exc, ast.Call):
        return False
    call = body[0].exc
    return ast.unparse(call.func) == "HTTPException" and any(
        kw.arg == "status_code" and ast.unparse(kw.value) in {"404", "HTTPStatus.NOT_FOUND"} for kw in call.keywords
    )


# ----------------------------------------------------------------------------------------------- main


def snapshot(version: str, wheel: Path, label: str | None = None) -> dict[str, Any]:
    io_source = read_from_wheel(wheel, IO_STRUCT)
    http_source = read_from_wheel(wheel, HTTP_SERVER)
    if io_source is None or http_source is None:
        raise SystemExit(f"{wheel.name}: {IO_STRUCT} or {HTTP_SERVER} missing")
    classes, aliases, imported = parse_io_struct(io_source)
    structs = {name: resolve_struct(name, classes) for name in KEPT_STRUCTS if name in classes}
    used_aliases, external = collect_aliases(structs, aliases, imported)
    imported_aliases, enums = resolve_external(external, lambda member: read_from_wheel(wheel, member))
    return {
        "sglang_version": version,
        "label": label or version,
        "wheel": wheel.name,
        "source": IO_STRUCT,
        "routes_source": HTTP_SERVER,
        "generated_by": "scripts/snapshot_io_structs.py (ast parse of the released wheel; never imported)",
        "missing_structs": [name for name in KEPT_STRUCTS if name not in classes],
        "structs": structs,
        "aliases": {**used_aliases, **imported_aliases},
        "enums": enums,
        "external_names": external,
        "endpoints": parse_routes(http_source, set(classes)),
    }


def snapshot_main(argv: list[str] | None, description: str, kind: str,
                  make: Callable[[str, str, Path], dict[str, Any]], summary: Callable[[dict[str, Any]], str]) -> int:
    """The command line both snapshot scripts share: `make(label, version, wheel)` for every `--versions` entry,
    written to `<out>/<kind>-<label>.json`, one `summary(data)` line each."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--versions", nargs="+", default=list(DEFAULT_VERSIONS),
                        help="releases, as VERSION or LABEL=VERSION (e.g. 0.5.15=0.5.15.post1)")
    parser.add_argument("--wheel-dir", type=Path, default=None, help="where wheels are (or are downloaded to)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "fakes" / "snapshots")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheel_dir = args.wheel_dir or Path(tmp)
        wheel_dir.mkdir(parents=True, exist_ok=True)
        for label, version in parse_versions(args.versions):
            data = make(label, version, download_wheel(version, wheel_dir))
            path = args.out / f"{kind}-{label}.json"
            path.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
            print(f"{path}: {summary(data)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return snapshot_main(argv, __doc__.split("\n\n")[0], "io_struct",
                         lambda label, version, wheel: snapshot(version, wheel, label),
                         lambda data: f"{len(data['structs'])} structs, {len(data['endpoints'])} routes, "
                                      f"missing {data['missing_structs']}")


if __name__ == "__main__":
    raise SystemExit(main())
