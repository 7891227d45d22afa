"""The mutants' outcome plumbing (``gpu.mutation``) on CPU: the share of mutants CI runs on real SGLang per commit."""

from __future__ import annotations

import pytest

from conformance.mutants import MUTANTS
from gpu.mutation import share


@pytest.mark.cpu
def test_the_ci_shares_cover_every_mutant_once_and_a_bad_share_says_the_form() -> None:
    names, n = sorted(MUTANTS), 7
    shares = [share(names, f"{i}/{n}") for i in range(n)]
    assert sorted(sum(shares, [])) == names and all(shares)
    assert share(names, None) == names
    for bad in ("7/7", "x", "1-7", "-1/7"):
        with pytest.raises(ValueError, match="expected i/n"):
            share(names, bad)
