"""Differential fidelity: the same script on the fake and on real SGLang of one release, diffed
(``python -m gpu.fidelity --release V``; :mod:`gpu.fidelity.script`; committed lists ``divergences-V.json``)."""
