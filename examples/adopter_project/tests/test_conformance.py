"""The weight-sync conformance suite, as tests of this tree."""

from conformance.suite import ConformanceSuite


class TestWeightSync(ConformanceSuite):
    integration = "ourframework.testing:integration"
    backends = ["fake"]
    scenarios = ["first-drain", "staleness", "failover", "lora"]  # a quick subset for every push
