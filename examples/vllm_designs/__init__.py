"""Four vLLM integrations written from the README alone (issue 41), none built on ``conformance.reference``:

* :mod:`.async_httpx`: an async httpx client with its own update cycle and rollout manager, engines stamped;
* :mod:`.threaded_requests`: a blocking ``requests`` client run in threads, versions kept on the client side;
* :mod:`.threaded_cleanup`: the same, removing the superseded checkpoint after each publish;
* :mod:`.lora_inplace`: one LoRA adapter name refreshed in place, prefix cache reset, rolled back on failure.

    python -m conformance --engine vllm --integration examples.vllm_designs.async_httpx:integration
"""
