"""The GPU backend (planned): real SGLang servers as Ray actors across ``--nodes`` nodes.

Design (DESIGN §7): a placement group with STRICT_SPREAD over nodes, one SGLang server actor per engine, a trainer
actor holding the same small model (built locally: config + random weights + tokenizer, no internet) that pushes
real weights (NCCL broadcast, disk, tensor). It implements ``conformance.backends.Backend`` behind the same wire
recorder (a forwarding proxy), so the scenarios, the faults injected at the wire (``WireLog.refuse``) and the
checkers run unchanged; the same Ray orchestration runs on
CPU with fake engines inside the actors on a ``ray.cluster_utils.Cluster``. Until it lands, the ``gpu``
parametrization of the suite skips with that reason.
"""
