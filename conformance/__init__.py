"""weightsync-conformance: invariants of async-RL weight sync, checked on fake or real SGLang engines."""

__version__ = "0.1.0"
