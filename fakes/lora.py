"""LoRA adapters of a fake engine (SGLang's ``LoRAManager`` + ``lora_registry``): load from a directory or from
tensors, the memory-pool checks, the q/k/v stacking, LRU eviction of unpinned adapters, refcounts held by running
requests, unload waiting for its users, and (0.5.23) the implicit reload of an adapter a request names after its
unload.

``LoraMixin`` is mixed into ``FakeEngine``; the state it uses is set up by ``FakeEngine.__init__``.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

from . import weights as W
from .asgi import Reply
from .failures import EngineCrashed, success_reply

LORA_NOT_ENABLED = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."


@dataclass(eq=False)
class _Adapter:
    name: str
    path: str
    pinned: bool
    users: int = 0


class LoraMixin:
    """LoRA adapter loading, unloading and lookup of a ``FakeEngine``."""

    def _lora_body(self, ok: bool, error: str | None, with_adapters: bool = True) -> Reply:
        """``LoRAUpdateOutput`` as the HTTP server writes it (its ``BaseReq`` fields included, io_struct.py); a
        success says ``error_message: ""`` (``LoRAManager.create_lora_update_result``'s default)."""
        error = "" if ok and error is None else error
        loaded = {a.name: a.path for a in self._loras.values()} if with_adapters else None
        return success_reply(ok, {"success": ok, "error_message": error, "loaded_adapters": loaded, "rid": None,
                                  "http_worker_ipc": None})

    async def load_lora_adapter(self, obj: Mapping[str, Any]) -> Reply:
        """``/load_lora_adapter``: no abort, no model-update lock, no version stamp
        (tokenizer_communicator_mixin.py load_lora_adapter)."""

        return await self._load_lora(obj["lora_name"], obj["lora_path"], bool(obj.get("pinned")),
                                     lambda: self._read_lora_dir(obj["lora_name"], obj["lora_path"]))

    async def _read_lora_dir(self, name: str, path: str) -> None:
        if not os.path.isdir(path) and path.count("/") > 1:
            # a path that is no directory is taken for a Hugging Face Hub repo id (lora/lora_config.py
            # snapshot_download), which huggingface_hub's validate_repo_id refuses
            raise ValueError(f"Repo id must be in the form 'repo_name' or 'namespace/repo_name': '{path}'. Use "
                             "`repo_type` argument if needed.")
        adapter = await asyncio.to_thread(W.load_lora_adapter, path)
        self._check_lora_fits(name, adapter["config"])
        _stack_qkv(adapter["tensors"])

    def _check_lora_fits(self, name: str, config: Mapping[str, Any]) -> None:
        """``LoRAManager.validate_new_adapter``: the adapter must fit the memory pool ``--max-lora-rank`` and
        ``--lora-target-modules`` set up (ValueError with SGLang's message)."""
        rank = int(config.get("r") or 0)
        modules = config.get("target_modules") or []
        modules = [modules] if isinstance(modules, str) else list(modules)
        allowed = self.lora_target_modules
        too_big = self.max_lora_rank is not None and rank > self.max_lora_rank
        outside = allowed is not None and "all" not in allowed and not set(modules) <= set(allowed)
        if too_big or outside:
            raise ValueError(
                f"LoRA adapter {name} with rank {rank} is incompatible with the current LoRA memory pool "
                "configuration. Please ensure that the LoRA adapter's rank is within the configured "
                "`--max-lora-rank` and that the target modules are included in `--lora-target-modules`.")

    async def load_lora_adapter_from_tensors(self, obj: Mapping[str, Any]) -> Reply:
        """0.5.10+: one ``serialized_tensors`` str (≤0.5.16) or ``serialized_named_tensors`` list (0.5.23)."""

        async def read() -> None:
            payload = obj["serialized_tensors"] if "serialized_tensors" in obj else obj["serialized_named_tensors"]
            _stack_qkv(W.decode_lora_tensor_payload(payload[0] if isinstance(payload, list) else payload,
                                                   release=self.profile.version))

        return await self._load_lora(obj["lora_name"], "__tensor__", bool(obj.get("pinned")), read)

    async def _load_lora(self, name: str, path: str, pinned: bool, read: Callable[[], Awaitable[None]]) -> Reply:
        if not self.enable_lora:
            return self._lora_body(False, LORA_NOT_ENABLED, with_adapters=False)
        self._bind()
        assert self._lora_update_lock is not None
        async with self._lora_update_lock:
            if name in self._loras:
                return self._lora_body(False, f"Failed to load LoRA adapter {name} because it is already loaded")
            try:
                await read()
            except W.UndecodablePayload as e:  # deserialized in the TP worker outside any try: the scheduler dies
                self.crash(f"{type(e).__name__} in load_lora_adapter_from_tensors: {e}")
                raise EngineCrashed(self.crash_reason) from None
            except W.WeightError as e:
                return self._lora_body(False, f"Failed to load LoRA adapter {name}: {e}")
            except (ValueError, AttributeError) as e:  # validate_new_adapter; a payload that is no dict
                return self._lora_body(False, str(e))
            except KeyError as e:  # LoRAAdapter.normalize_qkv_proj
                return self._lora_body(False, str(e))
            self._loras[name] = _Adapter(name, path, pinned)
            self._lora_refs[name] = (path, pinned)
            self._event("lora.load", name=name, path=path, pinned=pinned)
            while self.max_loras is not None and len(self._loras) > self.max_loras:  # max_loaded_loras: LRU out
                victim = next((a for a in self._loras.values() if not a.pinned), None)
                if victim is None:
                    message = "Didn't find any LoRA adapters when trying to evict LRU LoRA adapter."
                    return self._lora_body(False, message)
                await self._unload_locked(victim.name)
            return self._lora_body(True, None)

    async def unload_lora_adapter(self, obj: Mapping[str, Any]) -> Reply:
        """``/unload_lora_adapter``: unregister first (new requests then get 400), then wait for its users."""
        if not self.enable_lora:
            return self._lora_body(False, LORA_NOT_ENABLED, with_adapters=False)
        self._bind()
        assert self._lora_update_lock is not None
        name = obj["lora_name"]
        async with self._lora_update_lock:
            if name not in self._loras:
                message = f"LoRA with name {name} does not exist. Loaded LoRAs: {_odict_keys(self._loras)}"
                return self._lora_body(False, message, with_adapters=False)
            await self._unload_locked(name)
            return self._lora_body(True, None)

    async def _unload_locked(self, name: str) -> None:
        adapter = self._loras.pop(name)
        self._touch()
        await self._wait_for(lambda: adapter.users == 0)  # lora_registry.wait_for_unload
        self._event("lora.unload", name=name, path=adapter.path)

    async def _resolve_loras(self, names: list[str | None]) -> None:
        """``TokenizerManager._resolve_lora_path`` (fact ``lora_implicit_reload``): an adapter a request names that
        is not loaded is reloaded from where it was first loaded from; one never loaded is refused."""
        if not self.profile.lora_implicit_reload or not self.enable_lora:
            return
        for name in dict.fromkeys(n for n in names if n is not None):
            if name in self._loras:
                continue
            if name not in self._lora_refs:
                raise ValueError(f"Got LoRA adapter that has never been loaded: {name}\n"
                                 f"All loaded adapters: dict_keys({list(self._lora_refs)!r}).")
            path, pinned = self._lora_refs[name]
            self._event("lora.implicit_reload", name=name, path=path)
            reply = await self._load_lora(name, path, pinned, lambda: self._read_lora_dir(name, path))
            message = reply.body.get("error_message") or ""
            if not reply.body.get("success") and "already loaded" not in message:
                raise ValueError(f"Failed to implicitly load LoRA adapter {name}: {message}")

    def _lookup_adapter(self, name: str | None) -> _Adapter | None:
        if name is None:
            return None
        if not self.enable_lora:
            raise ValueError(LORA_NOT_ENABLED)
        adapter = self._loras.get(name)
        if adapter is None:  # lora_registry.acquire
            raise ValueError(
                f"The following requested LoRA adapters are not loaded: {name}\n"
                f"Loaded adapters: {_odict_keys(self._loras)}."
            )
        return adapter


def _stack_qkv(tensors: Mapping[str, Any]) -> None:
    """``LoRAAdapter.normalize_qkv_proj``: every q_proj weight is stacked with its v_proj (and k_proj, zeros when
    the adapter has none), so an adapter with q_proj but no v_proj fails with ``KeyError`` of the v_proj name."""
    for name in tensors:
        if "q_proj" in name and name.replace("q_proj", "v_proj") not in tensors:
            raise KeyError(name.replace("q_proj", "v_proj"))


def _odict_keys(d: Mapping[str, Any]) -> str:
    """How ``OrderedDict.keys()`` prints in SGLang's messages."""
    return f"odict_keys({list(d)!r})"
