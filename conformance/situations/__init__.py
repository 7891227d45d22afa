"""The situations a scenario builds and a check is judged on, one module each, holding the builder and the predicate
the checks read (one definition: the builder waits until the judge's own predicate holds on the wire, or records
that it could not):

- ``resident``: resident requests at a cycle's first pause, bump or transfer (I1-I2);
- ``producer``: the producer kept busy (in flight everywhere, the next turn, blocked on a full buffer);
- ``slow``: one engine held behind at a step of a cycle;
- ``gate``: answers held until every engine is paused (SGLang's pause gate);
- ``refused``: a cycle the engines refuse (SGLang's failure answers, injected at the wire);
- ``aborted``: requests the suite aborted;
- ``versions``: consumed groups across versions (mixed, after a failover, resumed across an update);
- ``sentinels``: the suite's own long-lived requests, resident on every engine through every cycle.

Beside them: ``registry`` (the situations the checks need, by name), ``scene`` (what a builder works with),
``waiting`` (the one bounded wait, woken by the wire) and ``timing`` (every duration: deadlines and aims)."""
