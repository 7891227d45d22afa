"""weightsync-conformance: invariants of async-RL weight sync, checked on fake SGLang or vLLM, or on real SGLang."""

__version__ = "0.1.0"

DEFAULT_INTEGRATION = "conformance.reference:integration"
"""The integration the suite runs when none is chosen: the reference integration that ships here."""
# the engine families and each one's default integration: conformance.families
