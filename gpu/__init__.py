"""Real engines, and their drop-in fakes: real SGLang and vLLM on CPU from one environment per release (``-m
sglang``, ``-m vllm``: what CI runs), the differentials that judge the fakes against them (:mod:`gpu.fidelity`), and
the same engines on a GPU cluster across ``--conformance-nodes`` nodes (``-m gpu``; README "Real engines on a GPU
cluster"). Each backend here is a set-up the conformance session asks for engines (``conformance.session``); the
cases themselves are the conformance suite's (``conformance/suite``).

* :mod:`gpu.families` — each family's real engines (its row's upper half): programs, launch line, reset, weight
  reads, cluster flags, differential;
* :mod:`gpu.launch` — the launch lines (``EngineSpec`` → each family's flags) for the real servers and their fakes;
* :mod:`gpu.sglang_cpu`, :mod:`gpu.vllm_cpu` (with :mod:`gpu.engine_env`) — one environment per release, installed
  and checked; :mod:`gpu.vllm_gloo` — the gloo weight-transfer engine registered into vLLM there;
* :mod:`gpu.engine` — an engine process supervised on its node (free port, ``/health`` deadline, log tail,
  process-group teardown, death with its parent), and the same as a Ray actor;
* :mod:`gpu.proxy` — the driver-side forwarding proxy behind the suite's ``WireRecorder`` (streams chunk by chunk);
* :mod:`gpu.weights` — the served checkpoint, and each engine's weights read back;
* :mod:`gpu.reset`, :mod:`gpu.vllm_reset` — an engine put back to the pool's initial state between scenarios;
* :mod:`gpu.backend` — ``RayBackend`` (``conformance.backends.Backend``) tying them together, with supervision;
  :mod:`gpu.local` — the same in local processes;
* :mod:`gpu.placement`, :mod:`gpu.cluster` — a ``STRICT_SPREAD`` placement group; connect to a cluster, or simulate
  N nodes on one machine (``ray.cluster_utils.Cluster``);
* :mod:`gpu.pool` — one engine set lent to every scenario of a session, reset between them;
* :mod:`gpu.sglang_setup`, :mod:`gpu.vllm_setup` — the set-ups ``pytest -m sglang`` / ``-m vllm`` run on (real
  engines on CPU); :mod:`gpu.gpu_setup` — the one ``pytest -m gpu`` runs on (skip reason, cluster or simulated
  cluster, served model);
* :mod:`gpu.mutation`, :mod:`gpu.trainer`, :mod:`gpu.tiny_model` — the mutants on real engines, the reference
  configured for engines on other nodes, a tiny random Llama built locally;
* ``gpu/scripts/device_check.py OUT`` — what of the GPU path runs on one GPU machine.

Under ``-m cpu`` the same ``RayBackend`` runs fake engines (``python -m fakes.launch_server``, same ARGS) on a
simulated 2-node cluster, so the orchestration, node loss and engine failures are tested in every CI; and
``pytest -m gpu --conformance-simulated-cluster`` runs the cluster command itself there.
"""
