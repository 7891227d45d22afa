"""The errors of weight handling: ``WeightError`` (an update cannot be applied) and ``CheckpointError``."""

from __future__ import annotations


class WeightError(Exception):
    """A weight update cannot be applied. ``str(e)`` is what the engine puts in its 400 body.

    ``partial`` is the store as far as the load got when it failed part-way (``WeightStore.updated``: SGLang's
    ``load_weights`` copies parameter by parameter, so the parameters before the failing one hold the new values),
    or None when nothing was loaded."""

    def __init__(self, message: str, partial: object = None) -> None:
        super().__init__(message)
        self.partial = partial


class UndecodablePayload(WeightError):
    """A tensor payload ``MultiprocessingSerializer.deserialize`` cannot read (not a pickle, a blocked global, a
    handle that cannot be opened). SGLang deserializes in the TP worker outside any ``try``
    (``managers/tp_worker.py`` ``load_lora_adapter_from_tensors``, ``deserialize_own_rank``; the weight updater's
    ``update_weights_from_tensor``, 0.5.10–0.5.23): the scheduler dies and the server exits."""


class CheckpointError(WeightError):
    """A checkpoint cannot be read.

    ``stage`` tells the engine which SGLang message wraps it (``model_runner.update_weights_from_disk``):
    ``"loader"`` -> ``"Failed to get model loader: ..."`` (bad load_format), ``"iterator"`` ->
    ``"Failed to get weights iterator: <e>."`` (no such directory, no weight files, bad index),
    ``"load"`` -> ``"Failed to update weights: <e>.\\nRolling back to original weights."`` (a weight file
    that cannot be read: truncated/partial safetensors, unreadable torch ``.bin``, missing tensors).
    """

    def __init__(self, message: str, stage: str = "load"):
        super().__init__(message)
        self.stage = stage


def first_line(e: BaseException) -> str:
    """The first line of an exception's text (its type name when it has none)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
