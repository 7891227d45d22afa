"""What the replay simulates: the run's shape (:class:`ReplayConfig`), its prompts, the agent's environment and
the trainer's weights. Defaults are the seed-000 incident's run (16 engines, groups of 8, an update per step
after a ≈ 44 s transfer, paused in place). The seed does not report the episode shape: 1,024 episodes in flight,
two turns of 126 s decoding and ≈ 31 min of environment after each are chosen so that about 65 requests decode
when an update lands and an unthrottled producer finishes ≈ 180 samples per step, as in the seed (README)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import random
import uuid
from dataclasses import dataclass, fields
from typing import Any, Iterator, Mapping

from fakes.profiles import DEFAULT_PROFILE, get_profile

from ..interface import ALL_PAUSE_MODES, RolloutConfig
from ..prompts import PromptBook


@dataclass(frozen=True)
class ReplayConfig:
    """Every parameter of a replay (each is a flag of ``python -m reports.replay``)."""

    engines: int = 16
    """SGLang engines behind the integration."""
    capacity: int = 64
    """Running requests per engine (``max_running_requests``); more wait in the engine's queue."""
    groups_in_flight: int = 128
    """Groups the rollout manager keeps generating (``max_in_flight_groups``): × ``group_size`` episodes."""
    group_size: int = 8
    """Samples per prompt."""
    turns: int = 2
    """``/generate`` turns per episode."""
    turn_s: float = 126.0
    """Decoding time of one turn (simulated seconds)."""
    step_s: float = 2.0
    """Simulated seconds one fake decode step stands for (a fake token is ``step_s`` of decoding)."""
    tool_s: float = 1845.0
    """Mean tool/environment delay after a turn (sandboxed tool calls, then the reward after the last turn)."""
    tool_spread: float = 0.5
    """The delay is ``tool_s × g × s``: ``g`` shared by a group's samples at a turn, uniform in 1 ± tool_spread..."""
    sample_spread: float = 0.1
    """... and ``s`` per sample, uniform in 1 ± sample_spread."""
    batch_groups: int = 12
    """Groups per training batch."""
    buffer_groups: int = 16
    """Finished groups waiting for the trainer (``buffer_capacity``)."""
    train_s: float = 400.0
    """Simulated seconds of one training step (forward, backward, optimizer)."""
    transfer_s: float = 44.0
    """Mean weight-transfer time of an update, paused."""
    transfer_spread: float = 14.0
    """Each update's transfer takes ``transfer_s`` ± up to this many seconds (uniform)."""
    updates: int = 20
    """Training steps, each ending with an update."""
    refuse_every: int = 0
    """Every this many updates (the Nth, the 2Nth, …) the last engine refuses its transfers (SGLang's 400, at the
    wire, as the ``one-engine-rejects`` scenario does), so the others hold weights that are never published: the cost
    table counts the samples served on them (P8). 0: none."""
    pause_mode: str = "in_place"
    transport: str = "tensor"
    max_staleness: int | None = None
    profile: str = DEFAULT_PROFILE
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("engines", "capacity", "groups_in_flight", "group_size", "turns", "batch_groups",
                     "buffer_groups", "updates"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("turn_s", "step_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("tool_s", "train_s", "transfer_s", "transfer_spread", "refuse_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("tool_spread", "sample_spread"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.transfer_spread > self.transfer_s:
            raise ValueError(f"transfer_spread ({self.transfer_spread}) must not exceed transfer_s ({self.transfer_s})")
        if self.pause_mode not in ALL_PAUSE_MODES:
            raise ValueError(f"pause_mode must be one of {sorted(ALL_PAUSE_MODES)}, got {self.pause_mode!r}")
        get_profile(self.profile)  # ValueError names the known ones
        if self.transport not in ("tensor", "disk"):
            raise ValueError(f"transport must be tensor or disk in the replay (a distributed update runs gloo in "
                             f"real time), got {self.transport!r}")

    @property
    def max_new_tokens(self) -> int:
        """Fake tokens per turn."""
        return max(1, round(self.turn_s / self.step_s))

    @property
    def episodes_in_flight(self) -> int:
        return self.groups_in_flight * self.group_size

    def rollout(self) -> RolloutConfig:
        return RolloutConfig(batch_size=self.batch_groups, group_size=self.group_size, turns=self.turns,
                             max_new_tokens=self.max_new_tokens, max_staleness=self.max_staleness,
                             max_in_flight_groups=self.groups_in_flight, buffer_capacity=self.buffer_groups)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


REDUCED = dict(engines=4, groups_in_flight=8, group_size=4, turns=2, turn_s=20.0, step_s=2.0, tool_s=30.0,
               batch_groups=4, buffer_groups=8, train_s=60.0, transfer_s=20.0, transfer_spread=5.0, updates=6)
"""A replay of a few seconds: the CI case and the quick checks."""

TASK_TEMPLATE = "task {i:06d} (seed {seed}): fix the failing test, then explain."
"""The replay's prompt text: prompt ``i`` names ``task i`` (the environment keys its delays on the prompt)."""


def _unit(*parts: object) -> float:
    """A uniform number in [0, 1) from a hash of ``parts`` (the same parts give the same number, run to run)."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2 ** 64


class Environment:
    """The agent's tool/environment delay after each turn (``network.ToolDelay``), a pure function of the seed,
    the task, how far the episode got (its prompt length) and the request: a group's samples share the task part,
    so they decode at about the same times, as a group of one prompt does in an agentic run."""

    def __init__(self, config: ReplayConfig, prompts: PromptBook) -> None:
        self.config, self.prompts = config, prompts

    def _task(self, text: Any) -> str:
        """The task a turn's text is for (its prompt's index, six digits), or the text itself for another text."""
        index = self.prompts.index_of(text)
        return text if index is None else f"{index:06d}"

    @property
    def episode_s(self) -> float:
        """The mean length of an episode: its turns and the delay after each."""
        return self.config.turns * (self.config.turn_s + self.config.tool_s)

    def start(self, payload: Any) -> float:
        """``network.StartDelay``: the episodes the manager starts at t=0 start spread over one episode length (a run
        in its steady state, not every episode at once); a group's samples start together."""
        if asyncio.get_running_loop().time() > 0:
            return 0.0
        text = payload.get("text") if isinstance(payload, dict) else None
        return self.episode_s * _unit(self.config.seed, "start", self._task(text))

    def __call__(self, payload: Any, answer: Any) -> float:
        meta = answer.get("meta_info") if isinstance(answer, dict) else None
        if not isinstance(meta, dict) or (meta.get("finish_reason") or {}).get("type") == "abort":
            return 0.0  # an aborted turn: the agent extracts no command, the episode ends at once
        c = self.config
        text = payload.get("text", "") if isinstance(payload, dict) else ""
        task = self.prompts.index_of(text)
        group = _unit(c.seed, "task", "" if task is None else f"{task:06d}", len(text) if isinstance(text, str) else 0)
        sample = _unit(c.seed, "sample", meta.get("id"))
        return c.tool_s * (1 + c.tool_spread * (2 * group - 1)) * (1 + c.sample_spread * (2 * sample - 1))


_UUID_RNG: contextvars.ContextVar[random.Random | None] = contextvars.ContextVar("replay_uuid_rng", default=None)
_SYSTEM_UUID4 = uuid.uuid4


def _uuid4() -> uuid.UUID:
    """``uuid.uuid4`` as installed by :func:`seeded_uuid4`: drawn from the replay's seed in the contexts of a replay
    (its tasks and the threads they start inherit it), the system's everywhere else."""
    rng = _UUID_RNG.get()
    return _SYSTEM_UUID4() if rng is None else uuid.UUID(int=rng.getrandbits(128), version=4)


@contextlib.contextmanager
def seeded_uuid4(seed: int) -> Iterator[None]:
    """``uuid.uuid4`` drawn from ``seed`` in this context while active (an integration's request ids repeat run to
    run); other threads, such as scenarios running at the same time, keep drawing the system's."""
    uuid.uuid4 = _uuid4  # type: ignore[assignment]  # once; the same function stays installed
    token = _UUID_RNG.set(random.Random(f"uuid:{seed}"))
    try:
        yield
    finally:
        _UUID_RNG.reset(token)


def trainer_weights(initial: Mapping[str, Any], step: int) -> dict[str, Any]:
    """The weights of training step ``step``: the engines' own parameters, shifted by the step."""
    return {name: t + 0.001 * step for name, t in initial.items()}
