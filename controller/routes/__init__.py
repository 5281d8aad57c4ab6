"""The controller's REST routes, one module per resource, each an `APIRouter` that controller/api.py's
`make_app` includes in this order (the first eight carry the /v1 prefix themselves: a route's own path is
the label of its latency metric, controller/metrics.py):

    datasets.py    POST /datasets, /datasets/path, /datasets/hf; GET /datasets, /datasets/{dataset}
    runs.py        POST /runs, GET /schema/run-config, GET /runs, /runs/{run}; POST /runs/{run}/pause|resume|stop
    enqueues.py    POST and GET /runs/{run}/enqueues
    progress.py    GET /runs/{run}/versions, /metrics, /staleness, /timings
    prompts.py     GET /runs/{run}/prompts/stats, /datasets/{dataset}/prompts/stats (the prompt memory)
    rollouts.py    GET /runs/{run}/rollouts (the rollout viewer, read from the bus)
    events.py      GET /runs/{run}/events, /ledger, /queues
    health.py      GET /health (open)
    prometheus.py  GET /metrics (outside /v1)
    dashboard.py   GET / and the /static/ directory it loads

A route reaches the service only through `deps.py` (FastAPI `Depends` on `app.state`), so a router is
defined once at import and serves any app that includes it; `common.py` holds what several routers share
(the error responses, the run-id path parameter, OpenAPI links, the 201/200 reply).
"""
