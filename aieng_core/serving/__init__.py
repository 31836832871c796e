"""The serving engine, split as vLLM splits it: the request and its sampling parameters
(request.py), the KV-cache pool (kv_cache.py), the scheduler that decides who runs each step
(scheduler.py), the model runner that runs a step (model_runner.py), sampling (sampling.py),
incremental detokenization (detokenizer.py), the engine loop that ties them (engine.py), and
the HTTP app (http_app.py, the only module that imports FastAPI)."""
