"""The conformance tests, run against the integration chosen by ``--integration``."""
