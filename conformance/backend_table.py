"""The backend table: every backend a conformance case can run on, one row each (plain data, imports nothing).

A row names its backend, the pytest marker its cases carry, and — by import path, so that choosing a backend imports
only its own code (the fake's path imports nothing from ``gpu/``) — the factory of its session set-up and how an
integration is adapted to it. The set-up (:class:`conformance.session.BackendSetup`) answers the rest once per
session: why its cases skip here, the deadlines its scenarios run under, which scenarios it cannot run, the engines
for each scenario. The plugin registers the markers, the suite parametrises its cases and the expectations file
checks its ``backend =`` keys from this table; adding a backend is one module with its set-up plus one row.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Option:
    """A command-line option a backend declares for itself (``--conformance-*``): given, its value goes to the
    backend's set-up factory as ``key``; not given, the set-up's own default applies."""

    flag: str
    key: str
    help: str
    kind: str = "value"
    """``value`` (a string), ``int`` or ``flag`` (on when given)."""
    metavar: str | None = None
    default: object = None
    """Its value when not given (None: the set-up's own default applies)."""
    check: str | None = None
    """``module:function`` the value is checked by as it is parsed (raises ``ValueError`` with what to fix); loaded
    only when the option is given."""
    excludes: tuple[str, str] | None = None
    """Another option it cannot be given with, and why (a usage error: "<flag> <why>")."""


@dataclass(frozen=True)
class BackendRow:
    """One backend."""

    name: str
    """What cases, reports and the expectations file call it (``…-<name>`` in a case's node id)."""
    marker: str
    """The pytest marker its cases carry (``-m <marker>`` selects them)."""
    about: str
    """The marker's help line."""
    setup: str
    """``module:attribute`` of the set-up's factory, called once per session with :attr:`options` as keywords."""
    options: tuple[str, ...] = ()
    """The session options the factory takes (fields of :class:`conformance.session.SessionOptions`)."""
    adapt: str | None = None
    """``module:attribute`` of ``Integration -> Integration``: how an integration is made to speak to these
    engines (None: as it is)."""
    preflight: bool = False
    """The release check (:mod:`conformance.preflight`) runs before an integration's first scenario here."""
    isolates: bool = False
    """``--conformance-isolate-scenarios`` runs each of its scenarios in a fresh process."""
    bounds_aborted_rate: bool = False
    """Real engines: a scenario's aborted-sample rate must stay under ``--conformance-max-aborted-rate``."""
    family: str | None = "sglang"
    """The engine family it runs (``sglang``, ``vllm``); None: the one ``--conformance-engine`` names (the fake, the
    GPU cluster).
    Under another family's ``--conformance-engine`` its cases skip, saying so."""
    run_ahead: int = 0
    """Scenarios of one integration run at once here, started ahead of the cases that read them (each scenario has
    engines of its own); 0: one at a time, when its first case asks (engines shared between scenarios)."""
    own: tuple[Option, ...] = ()
    """The options only this backend reads (the plugin adds them from here)."""


BACKENDS: dict[str, BackendRow] = {row.name: row for row in (
    BackendRow("fake", "cpu", "runs on CPU only (fake engines); every CI", "conformance.fake_setup:FakeSetup",
               options=("profile", "seed", "engine"), preflight=True, isolates=True, run_ahead=4, family=None),
    BackendRow("gpu", "gpu", "needs real SGLang or vLLM engines on GPUs (Ray cluster)", "gpu.gpu_setup:GpuSetup",
               options=("profile", "seed", "engine"), bounds_aborted_rate=True, family=None, own=(
                   Option("--conformance-nodes", "nodes", "nodes for the GPU backend (-m gpu; default 1)", "int",
                          "N", default=1, check="conformance.backend_table:at_least_one"),
                   Option("--conformance-ray-address", "ray_address", "Ray cluster of the GPU backend (default: env "
                          "RAY_ADDRESS, else Ray on this machine)", metavar="ADDR"),
                   Option("--conformance-model-path", "model_path", "model the GPU backend's engines serve, at this "
                          "path on every node (default: a tiny random Llama built here and copied to the nodes)",
                          metavar="DIR"),
                   Option("--conformance-simulated-cluster", "simulate", "GPU backend (-m gpu) on a simulated "
                          "--conformance-nodes-node Ray cluster on this machine, the engines' drop-in fakes in place "
                          "of real engines: rehearses the cluster path without GPUs", "flag",
                          excludes=("--conformance-ray-address", "starts its own Ray cluster on this machine: drop "
                                    "--conformance-ray-address, or drop --conformance-simulated-cluster to use that "
                                    "cluster")))),
    BackendRow("sglang", "sglang",
               "real SGLang on CPU from a release's environment (python -m gpu.sglang_cpu install)",
               "gpu.sglang_setup:from_options", options=("seed",), bounds_aborted_rate=True, own=(
                   Option("--conformance-sglang-release", "release", "real SGLang on CPU (-m sglang): the release "
                          "whose environment the engines run from (default: the --conformance-sglang-venv's, else "
                          "the newest; install: python -m gpu.sglang_cpu install --release V)", metavar="VERSION",
                          check="gpu.sglang_cpu:check_release"),
                   Option("--conformance-sglang-venv", "venv", "real SGLang on CPU (-m sglang): the release's "
                          "environment (default: env WEIGHTSYNC_SGLANG_VENV, else where gpu.sglang_cpu install puts "
                          "it)", metavar="DIR"),
                   Option("--conformance-sglang-ray", "ray", "real SGLang on CPU (-m sglang): engines in Ray actors "
                          "on a simulated 2-node cluster (default: local processes)", "flag"))),
    BackendRow("vllm", "vllm", "real vLLM on CPU from a release's environment (python -m gpu.vllm_cpu install)",
               "gpu.vllm_setup:VllmSetup", options=("seed",), bounds_aborted_rate=True, family="vllm"),
)}
"""The table: name → row, in the order a case's backends are parametrised in."""
REFERENCE_BACKEND = "fake"
"""The backend every CI runs (the fake); a failure there is a failure on every backend."""


def backend_names() -> list[str]:
    """The names of the table's backends, in order."""
    return list(BACKENDS)


def row(name: str) -> BackendRow:
    """The row of ``name``; KeyError naming the known backends."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise KeyError(f"unknown backend {name!r}; the backend table has {backend_names()}") from None


def at_least_one(value: int) -> int:
    """A count that must be at least 1."""
    if value < 1:
        raise ValueError("must be >= 1")
    return value
