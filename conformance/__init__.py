"""weightsync-conformance: invariants of async-RL weight sync, checked on fake SGLang or vLLM, or on real SGLang."""

__version__ = "0.1.0"

DEFAULT_INTEGRATION = "conformance.reference:integration"
"""The integration the suite runs when none is chosen: the reference integration that ships here."""
ENGINES = ("sglang", "vllm")
"""The engine families the fake backend fakes (``--engine``)."""
DEFAULT_INTEGRATIONS = {"sglang": DEFAULT_INTEGRATION, "vllm": "conformance.reference:vllm"}
"""Engine family → the integration the suite runs there when none is chosen (the reference, in its client)."""
