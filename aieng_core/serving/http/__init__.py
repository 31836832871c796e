"""The HTTP server of `aieng serve`: FastAPI in front of an EngineLoop, one concern a module.

- app.py: `create_app`, which composes everything below;
- replica.py: one loaded, verified, warmed bundle and the engine loop serving it;
- state.py: what the server is doing (loading, ready, draining), which replica serves, leases;
- following.py: following a deployment pointer (a promote or rollback swaps the replica);
- deployment_watch.py: the pointer's rollback readiness check, as the server exports it;
- config_watch.py: whether the config file the server started with still loads;
- provenance.py: the bundle id and data version every response names (X-Aieng-Bundle-Id,
  X-Aieng-Data-Version);
- generation.py: one request's engine requests, their outputs, its deadline and usage;
- streaming.py: server-sent events;
- middleware.py: request ids and provenance headers, access and request logs, counts, the body limit;
- tracing.py: OpenTelemetry spans of each request, when the OTEL_* environment asks for them;
- routes_native.py (/generate, /predict), routes_openai.py (/v1/*), routes_ops.py (health,
  version, metrics), routes_admin.py (/admin/reload);
- errors.py, api_models.py, api_schema.py, metrics.py, logs.py; server.py runs it all under
  uvicorn with a graceful drain.

The only package that imports FastAPI or Starlette: the engine knows nothing of HTTP.
"""
