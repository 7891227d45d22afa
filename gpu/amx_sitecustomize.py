"""Installed as ``sitecustomize`` in a real-vLLM environment by ``gpu/vllm_cpu.py``. vLLM's CPU attention takes its
AMX kernels wherever the CPU reports AMX tiles and the dtype is bfloat16 (``vllm/v1/attention/backends/cpu_attn.py``
``_get_attn_isa``, 0.32.0), but Linux lets a process run AMX instructions only once it asked for the tile data state
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``), and the worker never asks: on a machine with AMX it dies
of SIGILL at its first decode step (measured). Every interpreter of the environment asks at start; where the CPU
or the kernel has no AMX the call fails and nothing changes. Nothing in vLLM is edited."""

import ctypes
import platform
import sys

if sys.platform == "linux" and platform.machine() == "x86_64":
    _SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18
    try:
        ctypes.CDLL(None, use_errno=True).syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)
    except (OSError, AttributeError):
        pass
