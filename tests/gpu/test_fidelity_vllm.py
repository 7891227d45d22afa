"""The vLLM differential (``python -m gpu.fidelity --engine vllm``): the committed list explained and measured with
this script and this fake (CPU), and (``-m vllm``, where real vLLM's environment exists) the fake vLLM against real
vLLM on CPU: a divergence not in the list, or a listed one that no longer happens, fails."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gpu.fidelity import vllm as script
from gpu.fidelity.lists import CLASSES
from gpu.fidelity.vllm import divergences_file, main as vllm_main, script_digest
from gpu.vllm_cpu import RELEASES, status


@pytest.mark.cpu
@pytest.mark.parametrize("release", RELEASES)
def test_every_vllm_divergence_is_explained_and_the_list_is_current(release: str) -> None:
    path = divergences_file(release)
    assert path.exists(), f"{path.name} is missing: python -m gpu.fidelity --engine vllm --release {release} --update"
    recorded = json.loads(path.read_text())
    assert recorded["script"] == script_digest(), (
        f"{path.name} was measured with another script or fake ({recorded['script']}, now {script_digest()}): "
        f"re-measure with python -m gpu.fidelity --engine vllm --release {release} --update")
    for entry in recorded["divergences"]:
        assert entry["class"] in CLASSES and entry["why"] not in ("", "TODO"), entry


class _Held:
    async def result(self) -> dict[str, Any]:
        return {"full budget": True}


@pytest.mark.cpu
@pytest.mark.parametrize(("seen", "lands_on", "expected"), [
    ([True, True, True], 2, (2, True)),        # the call found the request finished once: made again, and it landed
    ([True] * 5, None, (5, False)),            # never landed: the situation is recorded as not built
    ([False] * 5, None, (5, False)),           # never seen decoding: the call is still made (the step observed)
])
def test_a_call_meant_to_land_mid_decode_is_made_again_until_it_does_and_says_when_it_never_did(
        monkeypatch: pytest.MonkeyPatch, seen: list[bool], lands_on: int | None, expected: tuple[int, bool]) -> None:
    tries = iter(seen)
    acts: list[int] = []
    undos: list[int] = []

    async def decoding(*_: Any) -> tuple[_Held, bool]:
        return _Held(), next(tries)

    async def act(_: Any) -> bool:
        acts.append(1)
        return len(acts) == lands_on

    async def undo() -> None:
        undos.append(1)

    monkeypatch.setattr(script, "decoding", decoding)
    _, landed = asyncio.run(script.during_decode(None, "", act, undo))  # type: ignore[arg-type]
    assert (len(acts), landed) == expected and len(undos) == len(acts) - 1


@pytest.mark.vllm
@pytest.mark.timeout(900)
@pytest.mark.parametrize("release", RELEASES)
def test_the_fake_vllm_diverges_from_real_vllm_only_where_listed(release: str) -> None:
    env = status(release, None, import_check=False)
    if not env.usable:
        pytest.skip(f"-m vllm needs a real-vLLM environment: {env.reason}")
    assert vllm_main(["--release", release]) == 0, f"new or gone divergences on vLLM {release}: see the output above"


@pytest.mark.cpu
@pytest.mark.slow  # the script's two lifetimes on the fake vLLM (~8 s)
@pytest.mark.timeout(300)
def test_every_route_of_the_fake_vllm_is_compared_or_listed_with_its_reason(capsys: pytest.CaptureFixture[str]) -> None:
    """No route of the fake vLLM goes uncompared with real vLLM unless gpu/fidelity/uncovered-vllm.json says why; a
    listed one that is compared now must go."""
    assert script.coverage_main(RELEASES) == 0, capsys.readouterr().out
    assert f"vllm {RELEASES[0]}: {len(script.surface(RELEASES[0]))} routes served" in capsys.readouterr().out
