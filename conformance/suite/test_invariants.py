"""Every invariant, checked on every scenario it applies to, on each backend, against the session's integration
(``--conformance-integration``; ``python -m conformance`` runs this module). An adopter subclasses
:class:`conformance.suite.ConformanceSuite` in its own tree instead."""

from __future__ import annotations

from conformance.suite import ConformanceSuite


class TestConformance(ConformanceSuite):
    """The session's integration (``integration = None``)."""
