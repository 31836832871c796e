"""The serving engine, split as vLLM splits it: the request and its sampling parameters
(request.py), the KV-cache pool (kv_cache.py), the scheduler that decides who runs each step
(scheduler.py), the model runner that runs a step (model_runner.py), sampling (sampling.py),
incremental detokenization (detokenizer.py), the engine that ties them into steps
(engine.py), the loop that runs it in a thread (engine_loop.py), greedy continuations
(greedy.py) and where it runs (device.py). The HTTP server is the subpackage http/, the only
code that imports FastAPI: the engine knows nothing of HTTP."""
