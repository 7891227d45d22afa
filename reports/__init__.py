"""Conformance results: the JSON result and its Markdown rendering (``python -m reports``)."""
