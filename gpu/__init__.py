"""Real engines, and their drop-in fakes, as processes the suite launches and supervises: on a GPU cluster across
``--conformance-nodes`` nodes (``-m gpu``, SGLang or vLLM; README "Real engines on a GPU cluster"), and real SGLang and
vLLM on CPU from one environment per release (``-m sglang``, ``-m vllm``), with the differentials that judge the fakes
against them (:mod:`gpu.fidelity`).

* :mod:`gpu.launch` — one launch line (``EngineSpec`` → SGLang's flags) for ``sglang.launch_server`` and the fake;
* :mod:`gpu.engine` — an engine process supervised on its node (free port, ``/health`` deadline, log tail,
  process-group teardown, death with its parent), and the same as a Ray actor;
* :mod:`gpu.placement` — a ``STRICT_SPREAD`` placement group over distinct nodes;
* :mod:`gpu.proxy` — the driver-side forwarding proxy behind the suite's ``WireRecorder`` (streams chunk by chunk);
* :mod:`gpu.weights` — the served checkpoint, and each engine's weights read through ``/get_weights_by_name``;
* :mod:`gpu.backend` — ``RayBackend`` (``conformance.backends.Backend``) tying them together, with supervision;
* :mod:`gpu.cluster` — connect to a cluster, or simulate N nodes on one machine (``ray.cluster_utils.Cluster``);
* :mod:`gpu.pool` — one engine set lent to every scenario of a session, reset between them;
* :mod:`gpu.suite` — what ``pytest -m gpu`` runs on (skip reason, cluster or simulated cluster, served model, each
  family's launch line on GPUs);
* :mod:`gpu.sglang_suite`, :mod:`gpu.vllm_suite` — what ``pytest -m sglang`` / ``-m vllm`` run on (real engines on
  CPU);
* :mod:`gpu.trainer` — the reference integration configured for engines on other nodes;
* :mod:`gpu.tiny_model` — ``python -m gpu.tiny_model OUT``: a tiny random Llama built locally;
* ``gpu/scripts/device_check.sh OUT`` — what of the GPU path runs on one GPU machine.

Under ``-m cpu`` the same ``RayBackend`` runs fake engines (``python -m fakes.launch_server``, same ARGS) on a
simulated 2-node cluster, so the orchestration, node loss and engine failures are tested in every CI; and
``pytest -m gpu --conformance-simulated-cluster`` runs the cluster command itself there.
"""
