"""The vLLM differential (``python -m gpu.fidelity --engine vllm``): the committed list explained and measured with
this script and this fake (CPU), and (``-m vllm``, where real vLLM's environment exists) the fake vLLM against real
vLLM on CPU: a divergence not in the list, or a listed one that no longer happens, fails."""

from __future__ import annotations

import json

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
