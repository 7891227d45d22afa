"""The GPU backend: real SGLang servers supervised by Ray actors across ``--conformance-nodes`` nodes (README "Real SGLang on
a GPU cluster").

* :mod:`gpu.launch` — one launch line (``EngineSpec`` → SGLang's flags) for ``sglang.launch_server`` and the fake;
* :mod:`gpu.engine` — an engine process supervised on its node (free port, ``/health`` deadline, log tail,
  process-group teardown, death with its parent), and the same as a Ray actor;
* :mod:`gpu.placement` — a ``STRICT_SPREAD`` placement group over distinct nodes;
* :mod:`gpu.proxy` — the driver-side forwarding proxy behind the suite's ``WireRecorder`` (streams chunk by chunk);
* :mod:`gpu.weights` — the served checkpoint, and each engine's weights read through ``/get_weights_by_name``;
* :mod:`gpu.backend` — ``RayBackend`` (``conformance.backends.Backend``) tying them together, with supervision;
* :mod:`gpu.cluster` — connect to a cluster, or simulate N nodes on one machine (``ray.cluster_utils.Cluster``);
* :mod:`gpu.suite` — what ``pytest -m gpu`` runs on (skip reason, cluster, served model);
* :mod:`gpu.trainer` — the reference integration configured for engines on other nodes;
* :mod:`gpu.tiny_model` — ``python -m gpu.tiny_model OUT``: a tiny random Llama built locally;
* ``gpu/scripts/device_check.sh OUT`` — what of the GPU path runs on one GPU machine.

Under ``-m cpu`` the same ``RayBackend`` runs fake engines (``python -m fakes.launch_server``, same ARGS) on a
simulated 2-node cluster, so the orchestration, node loss and engine failures are tested in every CI.
"""
