"""fakes/structs.py: SGLang's request structs per version (from committed snapshots) and body validation.

The snapshots come from the released wheels (scripts/snapshot_io_structs.py); these tests pin the spec facts
they must contain, check that `validate` fills every default exactly as the snapshot says, produces SGLang's
400 bodies, and agrees value by value with pydantic v2 (which SGLang's FastAPI layer runs) where pydantic is
installed. The end-to-end check that the fake's app accepts every field SGLang accepts is
`test_app_accepts_every_field` below.
"""

from __future__ import annotations

import array
import base64
import binascii
import enum
import importlib.util
import json
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fakes import structs
from fakes.structs import NO_BODY, RequestError, validate

pytestmark = pytest.mark.cpu

REPO = Path(__file__).resolve().parents[2]
VERSIONS = ("0.5.4", "0.5.10", "0.5.15", "0.5.23")


def _struct_params() -> list[tuple[str, str]]:
    return [(v, name) for v in VERSIONS for name in structs.snapshot(v)["structs"]]


SAMPLE_BY_TYPE = {  # a valid value for each annotation a required field has
    "str": "x",
    "int": 1,
    "List[str]": ["a"],
    "List[List[int]]": [[2, 2]],
    "Dict[str, str]": {"k": "v"},
    "Dict[str, Any]": {"r": 8},
    "List[Union[str, bytes]]": ["aGk="],
    "Annotated[List[bytes], Base64Bytes()]": ["aGk="],
}


def required_sample(name: str, version: str) -> dict[str, Any]:
    fields = structs.struct_fields(name, version)
    return {f: SAMPLE_BY_TYPE[spec["type"]] for f, spec in fields.items() if spec["required"]}


# ----------------------------------------------------------------------------------------------- snapshots


@pytest.mark.parametrize("version", VERSIONS)
def test_snapshot_files_parse_and_name_their_source(version: str) -> None:
    data = json.loads((REPO / "fakes" / "snapshots" / f"io_struct-{version}.json").read_text())
    assert data["label"] == version and data["sglang_version"] in (version, version + ".post1")  # 0.5.15: .post1
    assert data["wheel"].startswith(f"sglang-{data['sglang_version']}-")
    assert data["source"] == "sglang/srt/managers/io_struct.py"
    assert data["structs"] and data["endpoints"]
    for name, struct in data["structs"].items():
        assert struct["kind"] in {"dataclass", "msgspec"}, name
        for fname, spec in struct["fields"].items():
            assert set(spec) >= {"type", "default", "required", "default_factory"}, (name, fname)
            if spec["required"]:
                assert spec["default"] is None and spec["default_factory"] is None, (name, fname)
            # every annotation compiles (unknown names become Any, never an exception)
            structs.compiled_type(spec["type"], version)
        assert {"rid", "http_worker_ipc"} <= set(struct["fields"]), f"{name} lacks BaseReq fields"  # 0.5.4+


def test_spec_facts_are_in_the_snapshots() -> None:
    for v in VERSIONS:  # spec §1.1: abort_all_requests=True since the first release
        assert structs.struct_fields("UpdateWeightVersionReqInput", v)["abort_all_requests"]["default"] is True
        assert structs.struct_fields("UpdateWeightVersionReqInput", v)["new_version"]["required"] is True
        disk = structs.struct_fields("UpdateWeightFromDiskReqInput", v)
        assert disk["abort_all_requests"]["default"] is False and disk["model_path"]["required"]
        assert not structs.has_struct("UpdateWeightsFromDiskReqInput", v)  # the real name is singular
    # spec §2.1: pause/continue have no body before 0.5.6
    assert not structs.has_struct("PauseGenerationReqInput", "0.5.4")
    assert structs.endpoints("0.5.4")["/pause_generation"]["struct"] is None
    for v in ("0.5.10", "0.5.23"):
        mode = structs.struct_fields("PauseGenerationReqInput", v)["mode"]
        assert mode["type"] == "Literal['abort', 'retract', 'in_place']" and mode["default"] == "abort"
        assert structs.endpoints(v)["/pause_generation"]["body_required"] is True
    assert "torch_empty_cache" in structs.struct_fields("ContinueGenerationReqInput", "0.5.23")
    assert "torch_empty_cache" not in structs.struct_fields("ContinueGenerationReqInput", "0.5.10")
    # spec §3.1
    assert "flush_cache" not in structs.struct_fields("UpdateWeightFromDiskReqInput", "0.5.4")
    assert structs.struct_fields("UpdateWeightFromDiskReqInput", "0.5.10")["flush_cache"]["default"] is True
    assert "Base64Bytes" in structs.struct_fields("UpdateWeightsFromTensorReqInput", "0.5.23")[
        "serialized_named_tensors"]["type"]
    assert structs.struct_fields("UpdateWeightsFromDistributedReqInput", "0.5.23")["selector"]["default"] == "all"
    # spec §0.1 / §5: routes per version
    assert "/begin_weight_update" in structs.endpoints("0.5.23")
    assert "/begin_weight_update" not in structs.endpoints("0.5.10")
    assert structs.endpoints("0.5.10")["/get_weight_version"].get("always_404") is True
    assert "always_404" not in structs.endpoints("0.5.4")["/get_weight_version"]
    assert "/get_weight_version" not in structs.endpoints("0.5.23")
    assert "/model_info" not in structs.endpoints("0.5.4") and "/model_info" in structs.endpoints("0.5.10")
    assert "/load_lora_adapter_from_tensors" not in structs.endpoints("0.5.4")
    assert structs.endpoints("0.5.10")["/flush_cache"]["query"]["timeout"]["default"] == 0.0


def test_profiles_agree_with_the_snapshots() -> None:
    """Each route/field switch in fakes/profiles.py says what the released wheel has."""
    import fakes.profiles as profiles
    for v in VERSIONS:
        p = profiles.PROFILES[v]
        routes = structs.endpoints(v)
        live = {path for path, e in routes.items() if not e.get("always_404")}
        assert p.pause_modes == structs.has_struct("PauseGenerationReqInput", v), v
        assert p.weight_update_sessions == ("/begin_weight_update" in live), v
        assert p.model_info_route == ("/model_info" in live), v
        assert p.ready_route == ("/ready" in live), v
        assert p.destroy_group_route == ("/destroy_weights_update_group" in live), v
        assert p.weight_version_alias == ("/weight_version" in routes), v
        assert p.flush_timeout_query == ("timeout" in routes["/flush_cache"].get("query", {})), v
        assert p.disk_flush_cache_field == ("flush_cache" in structs.struct_fields("UpdateWeightFromDiskReqInput", v))
        expected_gwv = "gone" if "/get_weight_version" not in routes else (
            "deprecated" if routes["/get_weight_version"].get("always_404") else "ok")
        assert p.get_weight_version == expected_gwv, v
        cont = structs.struct_fields("ContinueGenerationReqInput", v) if p.pause_modes else {}
        assert p.continue_torch_empty_cache == ("torch_empty_cache" in cont), v
        if p.lora_from_tensors_field is None:
            assert "/load_lora_adapter_from_tensors" not in routes
        else:
            assert p.lora_from_tensors_field in structs.struct_fields("LoadLoRAAdapterFromTensorsReqInput", v)


def test_snapshot_script_extracts_structs_and_routes_offline() -> None:
    """The ast extraction on a tiny hand-written io_struct / http_server (no download, no import of sglang)."""
    spec = importlib.util.spec_from_file_location("snapshot_io_structs", REPO / "scripts" / "snapshot_io_structs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["snapshot_io_structs"] = module
    spec.loader.exec_module(module)
    io_src = '''
from dataclasses import dataclass, field
import msgspec
Spans = List[Dict[str, int]]
class BaseReq(msgspec.Struct, kw_only=True):
    rid: Optional[str] = None
class A(BaseReq, kw_only=True):
    name: str
    n: int = 3
    tags: List[str] = msgspec.field(default_factory=list)
    spans: Optional[Spans] = None
    mode: Literal["x", "y"] = "x"
@dataclass
class B:
    rid: Optional[str] = field(default=None, kw_only=True)
    x: float = 1.5
    def __post_init__(self):
        pass
'''
    classes, aliases, imported = module.parse_io_struct(io_src)
    a = module.resolve_struct("A", classes)
    assert a["kind"] == "msgspec" and a["bases"] == ["BaseReq"]
    assert list(a["fields"]) == ["rid", "name", "n", "tags", "spans", "mode"]
    assert a["fields"]["rid"]["declared_in"] == "BaseReq"
    assert a["fields"]["name"]["required"] and not a["fields"]["n"]["required"] and a["fields"]["n"]["default"] == 3
    assert a["fields"]["tags"]["default_factory"] == "list" and not a["fields"]["tags"]["required"]
    b = module.resolve_struct("B", classes)
    assert b["kind"] == "dataclass" and b["fields"]["x"]["default"] == 1.5 and b.get("has_post_init")
    used, external = module.collect_aliases({"A": a}, aliases, imported)
    assert used == {"Spans": "List[Dict[str, int]]"}
    modules = {  # an imported name is read where SGLang defines it, re-exports followed
        "sglang/m/batch.py": "from sglang.m.modality import Modality\nMode = Union[bool, Literal['last']]\n"
                             "Odd = Union[bool, Other]\nclass Spans(msgspec.Struct):\n    x: int\n",
        "sglang/m/modality.py": "class Modality(Enum):\n    IMAGE = auto()\n    VIDEO = auto()\n    _hidden = 7\n",
    }
    found = module.resolve_external({n: f"sglang.m.batch.{n}" for n in ("Modality", "Mode", "Odd", "Spans")}
                                    | {"np": "numpy.ndarray"}, modules.get)
    assert found == ({"Mode": "Union[bool, Literal['last']]"},
                     {"Modality": {"class": "Modality", "module": "sglang.m.modality", "values": [1, 2]}})
    http_src = '''
@app.post("/a")
async def a(obj: Annotated[A, Body()], request: Request):
    pass
@app.get("/gone")
@app.get("/gone2")
async def gone():
    raise HTTPException(status_code=404, detail="deprecated")
@app.api_route("/flush", methods=["GET", "POST"])
async def flush(timeout: float = Query(0.0, ge=0.0)):
    pass
@app.post("/pause")
async def pause(request: Request):
    pass
'''
    routes = module.parse_routes(http_src, set(classes))
    assert routes["/a"]["struct"] == "A" and routes["/a"]["body_required"] is True
    assert routes["/gone"]["always_404"] and routes["/gone2"]["always_404"]
    assert routes["/flush"]["methods"] == ["GET", "POST"] and routes["/flush"]["query"]["timeout"]["default"] == 0.0
    assert routes["/pause"]["struct"] is None


# ----------------------------------------------------------------------------------------------- validate


@pytest.mark.parametrize(("version", "name"), _struct_params())
def test_validate_fills_every_default_exactly_as_the_snapshot_says(version: str, name: str) -> None:
    body = required_sample(name, version)
    out = validate(name, dict(body, not_a_field_of_sglang=1), version)
    fields = structs.struct_fields(name, version)
    assert set(out) == set(fields), "unknown keys dropped, every field present"
    for fname, spec in fields.items():
        if spec["required"]:
            assert out[fname] == body[fname]
            continue
        expected = [] if spec["default_factory"] == "list" else {} if spec["default_factory"] == "dict" else \
            spec["default"]
        post_init = structs.POST_INIT.get(name, {}).get(fname)
        if post_init is not None and expected == post_init[0]:
            expected = post_init[1]
        assert out[fname] == expected and type(out[fname]) is type(expected), (fname, out[fname], expected)


def test_well_known_defaults() -> None:
    for v in VERSIONS:
        assert validate("UpdateWeightVersionReqInput", {"new_version": "7"}, v)["abort_all_requests"] is True
        disk = validate("UpdateWeightFromDiskReqInput", {"model_path": "/m"}, v)
        assert disk["abort_all_requests"] is False and disk["weight_version"] is None
        assert validate("AbortReq", {}, v)["rid"] == ""  # __post_init__: rid None -> ""
        assert validate("AbortReq", {"rid": "r1"}, v)["rid"] == "r1"
        assert validate("InitWeightsUpdateGroupReqInput", {"master_address": "h", "master_port": 1, "rank_offset": 1,
                                                           "world_size": 2}, v)["backend"] == "nccl"
    assert validate("PauseGenerationReqInput", {}, "0.5.23")["mode"] == "abort"
    assert validate("ContinueGenerationReqInput", {}, "0.5.23")["torch_empty_cache"] is True


def _message(exc: pytest.ExceptionInfo[RequestError]) -> str:
    assert exc.value.status == 400
    body = exc.value.body
    assert body["object"] == "error" and body["type"] == "Bad Request" and body["code"] == 400
    assert body["param"] is None and list(body) == ["object", "message", "type", "param", "code"]
    return body["message"]


@pytest.mark.parametrize("version", VERSIONS)
def test_bad_bodies_get_sglangs_400(version: str) -> None:
    union = structs.snapshot(version)["structs"]["UpdateWeightVersionReqInput"]["kind"] == "msgspec"  # one error more
    with pytest.raises(RequestError) as exc:
        validate("UpdateWeightVersionReqInput", {}, version, path="/update_weight_version")
    msg = _message(exc)
    assert msg.startswith(f"{1 + union} validation error") and "'msg': 'Field required'" in msg
    branch = "'function-after[build_struct(), UpdateWeightVersionReqInput]', " if union else ""
    assert f"('body', {branch}'new_version')" in msg and "POST /update_weight_version" in msg
    with pytest.raises(RequestError) as exc:
        validate("UpdateWeightVersionReqInput", {"new_version": 7}, version)
    assert "'type': 'string_type'" in _message(exc)  # int -> str is refused (pydantic v2)
    with pytest.raises(RequestError) as exc:
        validate("UpdateWeightVersionReqInput", NO_BODY, version)
    assert "'loc': ('body',), 'msg': 'Field required'" in _message(exc)
    with pytest.raises(RequestError) as exc:
        validate("UpdateWeightVersionReqInput", ["new_version"], version)
    assert "_type'" in _message(exc)
    with pytest.raises(RequestError) as exc:
        structs.validate_raw("UpdateWeightVersionReqInput", b"{not json", version)
    assert "'type': 'json_invalid'" in _message(exc)
    with pytest.raises(RequestError) as exc:
        validate("InitWeightsUpdateGroupReqInput", {"master_address": "h", "master_port": "x"}, version)
    msg = _message(exc)
    union = structs.snapshot(version)["structs"]["InitWeightsUpdateGroupReqInput"]["kind"] == "msgspec"
    assert msg.startswith(f"{3 + union} validation errors:") and "int_parsing" in msg and "'rank_offset'" in msg
    with pytest.raises(KeyError):
        validate("NoSuchReqInput", {}, version)


def test_a_msgspec_struct_s_errors_are_those_of_its_union_schema_as_real_sglang_answers() -> None:
    """0.5.15+ validates a msgspec struct through a union (an instance check, then the struct built from a typed
    dict: ``utils/msgspec_utils.py``); the first errors of what real SGLang 0.5.23 answered (``python -m
    gpu.fidelity``'s malformed bodies), verbatim."""
    with pytest.raises(RequestError) as exc:
        validate("PauseGenerationReqInput", [], "0.5.23")
    assert _message(exc).startswith(
        "2 validation errors:\n  {'type': 'is_instance_of', 'loc': ('body', 'is-instance[PauseGenerationReqInput]'), "
        "'msg': 'Input should be an instance of PauseGenerationReqInput', 'input': [], 'ctx': {'class': "
        "'PauseGenerationReqInput'}}\n  {'type': 'dict_type', 'loc': ('body', 'function-after[build_struct(), "
        "PauseGenerationReqInput]'), 'msg': 'Input should be a valid dictionary', 'input': []}")
    with pytest.raises(RequestError) as exc:
        validate("UpdateWeightVersionReqInput", {"rid": {"malformed": 1}}, "0.5.23")
    assert "  {'type': 'string_type', 'loc': ('body', 'function-after[build_struct(), UpdateWeightVersionReqInput]', "\
           "'rid'), 'msg': 'Input should be a valid string', 'input': {'malformed': 1}}\n  {'type': 'missing', 'loc': "\
           "('body', 'function-after[build_struct(), UpdateWeightVersionReqInput]', 'new_version')" in _message(exc)


@pytest.mark.parametrize("version", ["0.5.10", "0.5.15", "0.5.23"])
def test_names_io_struct_imports_are_checked_where_sglang_defines_them(version: str) -> None:
    """``num_items_assigned: Optional[Dict[Modality, List[int]]]``: ``Modality`` is a plain ``Enum`` of ints, so no
    JSON key matches it (real SGLang answered an ``enum`` error at the key and the value's own error; the fake had
    taken the key as ``Any``); 0.5.23's ``return_hidden_states`` and ``sampling_logprobs_mode`` are aliases from
    ``managers/schedule_batch.py`` (the fake had taken any value)."""
    with pytest.raises(RequestError) as exc:
        validate("GenerateReqInput", {"text": "a", "num_items_assigned": {"malformed": 1}}, version)
    message = _message(exc)
    assert "'type': 'enum', 'loc': ('body', 'num_items_assigned', 'malformed', '[key]'), 'msg': 'Input should be " \
           "1, 2 or 3'" in message and "'type': 'list_type', 'loc': ('body', 'num_items_assigned', 'malformed')" \
           in message
    assert validate("GenerateReqInput", {"text": "a", "num_items_assigned": {}}, version)["num_items_assigned"] == {}
    if version != "0.5.23":
        return
    for field, value in (("return_hidden_states", "malformed"), ("sampling_logprobs_mode", "everything")):
        with pytest.raises(RequestError) as exc:
            validate("GenerateReqInput", {"text": "a", field: value}, version)
        assert "literal_error" in _message(exc)
    assert validate("GenerateReqInput", {"text": "a", "return_hidden_states": "last",
                                         "sampling_logprobs_mode": "support"}, version)["return_hidden_states"] == "last"


@pytest.mark.parametrize(("value", "error"), [
    ({"malformed": 1}, "must be list or null; got dict"), (["a"], "elements must be int or list; got str"),
    ([1, "a"], "contains non-int64 element: 'str' object cannot be interpreted as an integer"),
    ([[1], "a"], "row 1: must be list; got str"), ([[1], [2**63]], "row 1: contains non-int64 element: "),
    ([], None), (None, None), ([[1, 2], []], None)])
def test_input_ids_are_checked_by_sglangs_plain_validator(value: Any, error: str | None) -> None:
    """0.5.23 checks ``/generate``'s ``input_ids`` with ``PlainValidator(validate_optional_list_i64_1d_2d)``
    (``utils/field_validators.py``): its messages, as a pydantic ``value_error`` (real SGLang 0.5.23 answered
    ``Value error, must be list or null; got dict`` for a dict)."""
    if error is None:
        assert validate("GenerateReqInput", {"input_ids": value}, "0.5.23")["input_ids"] == value
        return
    with pytest.raises(RequestError) as exc:
        validate("GenerateReqInput", {"input_ids": value}, "0.5.23")
    message = _message(exc)
    assert "'type': 'value_error', 'loc': ('body', 'input_ids')" in message and f"Value error, {error}" in message


def test_literal_and_base64_errors() -> None:
    for v in ("0.5.10", "0.5.23"):
        with pytest.raises(RequestError) as exc:
            validate("PauseGenerationReqInput", {"mode": "hard"}, v)
        assert "Input should be 'abort', 'retract' or 'in_place'" in _message(exc)
    with pytest.raises(RequestError) as exc:  # 0.5.23: Base64Bytes before-validator over the whole field
        validate("UpdateWeightsFromTensorReqInput", {"serialized_named_tensors": ["not base64!"]}, "0.5.23")
    assert "Value error, Expected base64-encoded bytes" in _message(exc)
    # 0.5.10: List[Union[str, bytes]] takes any string
    out = validate("UpdateWeightsFromTensorReqInput", {"serialized_named_tensors": ["not base64!"]}, "0.5.10")
    assert out["serialized_named_tensors"] == ["not base64!"]


def test_lax_coercions_follow_pydantic() -> None:
    v = "0.5.23"
    out = validate("UpdateWeightVersionReqInput", {"new_version": "2", "abort_all_requests": "false"}, v)
    assert out["abort_all_requests"] is False
    assert validate("UpdateWeightVersionReqInput", {"new_version": "2", "abort_all_requests": 0}, v)[
        "abort_all_requests"] is False
    out = validate("InitWeightsUpdateGroupReqInput",
                   {"master_address": "h", "master_port": "29500", "rank_offset": 1.0, "world_size": True}, v)
    assert (out["master_port"], out["rank_offset"], out["world_size"]) == (29500, 1, 1)
    assert validate("FlushCacheReqInput", {"timeout_s": 3}, v)["timeout_s"] == 3.0
    with pytest.raises(RequestError):
        validate("UpdateWeightVersionReqInput", {"new_version": "2", "abort_all_requests": "maybe"}, v)
    with pytest.raises(RequestError):
        validate("GetWeightsByNameReqInput", {"name": "w", "truncate_size": 1.5}, v)


# ----------------------------------------------------------------------------------------------- vs pydantic


class _Base64Bytes:
    """SGLang 0.5.23 `sglang.srt.utils.msgspec_utils.Base64Bytes`, copied for the differential test."""

    def __get_pydantic_core_schema__(self, source_type: Any, handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.no_info_before_validator_function(self._decode_value, handler(source_type))

    @classmethod
    def _decode_value(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return base64.b64decode(value, validate=True)
            except binascii.Error as exc:
                raise ValueError("Expected base64-encoded bytes") from exc
        if isinstance(value, list):
            return [cls._decode_value(item) for item in value]
        return value


def _validate_list_i64_1d(v: Any) -> list[int]:
    """SGLang 0.5.23 `sglang.srt.utils.field_validators.validate_list_i64_1d`, copied for the differential test."""
    if v is None:
        raise ValueError("must not be None")
    if not isinstance(v, list):
        raise ValueError(f"must be list; got {type(v).__name__}")
    if not v:
        return v
    if not isinstance(v[0], int):
        raise ValueError(f"elements must be int; got {type(v[0]).__name__}")
    try:
        array.array("q", v)
    except (TypeError, OverflowError) as e:
        raise ValueError(f"contains non-int64 element: {e}") from None
    return v


def _validate_optional_list_i64_1d_2d(v: Any) -> Any:
    """SGLang 0.5.23 `validate_optional_list_i64_1d_2d` (`utils/field_validators.py`), copied likewise."""
    if v is None:
        return v
    if not isinstance(v, list):
        raise ValueError(f"must be list or null; got {type(v).__name__}")
    if not v:
        return v
    if isinstance(v[0], int):
        return _validate_list_i64_1d(v)
    if isinstance(v[0], list):
        for i, row in enumerate(v):
            try:
                _validate_list_i64_1d(row)
            except ValueError as e:
                raise ValueError(f"row {i}: {e}") from None
        return v
    raise ValueError(f"elements must be int or list; got {type(v[0]).__name__}")


def _pydantic_type(text: str, version: str) -> Any:
    snap = structs.snapshot(version)
    ns: dict[str, Any] = {n: getattr(typing, n) for n in typing.__all__}
    ns.update({name: Any for name in snap["external_names"]})
    ns.update({name: enum.Enum(e["class"], [(f"M{i}", v) for i, v in enumerate(e["values"])])
               for name, e in snap.get("enums", {}).items()})
    from pydantic import PlainValidator

    ns.update(Base64Bytes=_Base64Bytes, PlainValidator=PlainValidator,
              validate_optional_list_i64_1d_2d=_validate_optional_list_i64_1d_2d)
    todo = dict(snap["aliases"])
    while todo:
        progressed = False
        for name, alias in list(todo.items()):
            try:
                ns[name] = eval(alias, ns)  # noqa: S307 - annotation text from our own snapshot
            except NameError:
                continue
            del todo[name]
            progressed = True
        assert progressed, todo
    return eval(text, ns)  # noqa: S307


ALL_TYPES = sorted({(v, spec["type"]) for v in VERSIONS for s in structs.snapshot(v)["structs"].values()
                    for spec in s["fields"].values()})
JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.integers(), st.integers(2**62, 2**65),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "a", "5", " 5 ", "5.0", "5.5", "true", "False", "yes", "off", "1", "0", "aGk=", "!!",
                     "abort", "in_place", "retract", "all", "draft", "x y", "1e3", "1_000", "5.", "-0", "\u0663"]),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["a", "k", "1"]), inner, max_size=2)),
    max_leaves=6,
)


def _normalised(x: Any) -> Any:
    if isinstance(x, enum.Enum):  # the fake keeps a member's value
        return _normalised(x.value)
    if isinstance(x, list | tuple):
        return [_normalised(i) for i in x]
    if isinstance(x, dict):
        return {k: _normalised(i) for k, i in x.items()}
    return type(x).__name__, x


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(version_and_type=st.sampled_from(ALL_TYPES), value=JSON_VALUES)
@example(version_and_type=("0.5.23", "Annotated[List[bytes], Base64Bytes()]"), value="\u0663")  # found in CI
@example(version_and_type=("0.5.23", "Optional[Dict[Modality, List[int]]]"), value={"1": [1], "k": "a"})
@example(version_and_type=("0.5.23", "Union[List[ReturnHiddenStatesMode], ReturnHiddenStatesMode]"), value=[1, "x"])
def test_type_checks_agree_with_pydantic(version_and_type: tuple[str, str], value: Any) -> None:
    """Accept/refuse, coerced value and the error list (type, loc, msg) match pydantic v2 lax mode."""
    import pydantic
    version, text = version_and_type
    adapter = pydantic.TypeAdapter(_pydantic_type(text, version))
    try:
        expected, expected_errors = adapter.validate_python(value), []
    except pydantic.ValidationError as e:
        expected, expected_errors = None, e.errors(include_url=False)
    got, errors = structs.check(structs.compiled_type(text, version), value)
    # typing caches Union[A, B] == Union[B, A], so pydantic's member order can follow an earlier Union: compare
    # the error lists as multisets.
    simplify = lambda errs: sorted(repr((e["type"], e["loc"], e["msg"])) for e in errs)  # noqa: E731
    assert simplify(errors) == simplify(expected_errors), (text, value)
    if not errors and "bytes" not in text:  # bytes stay base64 strings in the fake (documented)
        assert _normalised(got) == _normalised(expected), (text, value)


# ----------------------------------------------------------------------------------------------- fidelity


OUT_OF_SCOPE = {
    "/release_memory_occupation": "GPU memory offload (colocated training), no weight-sync semantics",
    "/resume_memory_occupation": "GPU memory offload (colocated training), no weight-sync semantics",
    "/update_weights_from_ipc": "CUDA IPC handles (ZMQ), colocated GPU only",
}
"""Snapshot routes with a body struct that the fake deliberately does not serve, and why."""


def _served(version: str) -> set[str]:
    from fakes.engine import FakeEngine

    return set(FakeEngine(profile=version, enable_lora=True).app.structs)


def _fidelity_cases() -> list[tuple[str, str, str]]:
    cases = []
    for v in VERSIONS:
        served = _served(v)
        for path, route in structs.endpoints(v).items():
            name = route.get("struct")
            if (name and structs.has_struct(name, v) and name != "GenerateReqInput" and "POST" in route["methods"]
                    and path in served):
                cases.append((v, path, name))
    return cases


@pytest.mark.parametrize("version", VERSIONS)
def test_only_documented_routes_are_left_out(version: str) -> None:
    """Every snapshot route with a request struct is served by the fake, except the documented ones."""
    served = _served(version)
    missing = {path for path, route in structs.endpoints(version).items()
               if route.get("struct") and structs.has_struct(route["struct"], version)
               and route["struct"] != "GenerateReqInput" and "POST" in route["methods"] and path not in served}
    assert missing <= set(OUT_OF_SCOPE), f"routes SGLang {version} has that the fake does not serve: " \
                                         f"{sorted(missing - set(OUT_OF_SCOPE))}"


@pytest.mark.asyncio
@pytest.mark.parametrize(("version", "path", "name"), _fidelity_cases())
async def test_app_accepts_every_field(version: str, path: str, name: str) -> None:
    """Every field SGLang accepts on a route the fake serves is accepted by the fake: the whole struct sent
    explicitly, each field at its default (required ones at a sample value), is never a validation 400."""
    from fakes.engine import FakeEngine
    import httpx

    engine = FakeEngine(profile=version, enable_lora=True)
    body = dict(required_sample(name, version))
    for fname, value in structs.defaults(name, version).items():
        body.setdefault(fname, value)
    body.pop("abort_all_requests", None)  # keep the engine calm; that default is covered elsewhere
    transport = httpx.ASGITransport(app=engine.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://fake", timeout=10) as client:
        resp = await client.post(path, json=body)
    if resp.status_code == 400:
        try:
            payload = resp.json()
        except ValueError:
            payload = {}
        assert not (isinstance(payload, dict) and payload.get("object") == "error"
                    and "validation error" in str(payload.get("message", ""))), (
            f"{version} {path}: the fake refused a body SGLang accepts: {payload}")
    assert resp.status_code != 404, f"{version} {path}: the fake answered 404 on a route it serves"


def _field_use_gaps() -> dict[str, list[str]]:
    """Fields of the structs the fake serves that no module of fakes/ mentions by name."""
    import re

    sources = "".join(p.read_text() for p in (REPO / "fakes").glob("*.py"))
    from fakes.engine import FakeEngine

    gaps: dict[str, set[str]] = {}
    for version in VERSIONS:
        served = getattr(FakeEngine(profile=version).app, "structs", {})
        for name in {n for n in served.values() if n}:
            for fname in structs.struct_fields(name, version):
                if not re.search(rf"[\"']{re.escape(fname)}[\"']", sources):
                    gaps.setdefault(name, set()).add(fname)
    return {name: sorted(fields) for name, fields in sorted(gaps.items())}


def test_every_field_is_consumed_or_explicitly_ignored() -> None:
    """With an `IGNORED_FIELDS = {struct: {field, ...}}` table in fakes/engine.py (or app.py), every field of
    every served struct is either read by the fake or listed there as deliberately ignored."""
    import fakes.engine as engine_mod
    table = getattr(engine_mod, "IGNORED_FIELDS", None)
    if table is None:
        import fakes.app as app_mod
        table = getattr(app_mod, "IGNORED_FIELDS", None)
    gaps = _field_use_gaps()
    if table is None:
        counts = ", ".join(f"{name}({len(fields)})" for name, fields in gaps.items())
        pytest.skip(f"no IGNORED_FIELDS table in fakes/engine.py or fakes/app.py; fields never read, per struct: "
                    f"{counts} (tests/fakes/test_structs.py::_field_use_gaps lists them)")
    missing = {name: [f for f in fields if f not in table.get(name, ())] for name, fields in gaps.items()}
    assert {k: v for k, v in missing.items() if v} == {}, "fields neither consumed nor listed in IGNORED_FIELDS"


def test_the_snapshots_are_the_table_s_releases_in_order() -> None:
    """One snapshot per release row of ``fakes.facts.SGLANG``, ordered by the one version parser."""
    from fakes.facts import SGLANG

    assert structs.available_versions() == list(SGLANG.releases)
