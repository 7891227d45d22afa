"""Our integration for weightsync-conformance: the reference cycle, except that we never stamp the engines (our
versions live on the client side, in each turn's ``policy_version``)."""

from conformance.reference import ReferenceIntegration, ReferenceUpdater, default_capabilities


class OurUpdater(ReferenceUpdater):
    async def stamp(self, new: int) -> None:
        return None  # no /update_weight_version: our rollout records carry the version instead


integration = ReferenceIntegration(name="ourframework", capabilities=default_capabilities(stamps_engines=False),
                                   updater_cls=OurUpdater)
