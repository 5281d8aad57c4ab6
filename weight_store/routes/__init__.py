"""The weight store's routes, one module per resource, each an `APIRouter` that weight_store/server.py's
`create_app` includes (in this order):

    health.py     GET /healthz (open), /metrics
    manifests.py  GET /v1/runs, /v1/runs/{run}/versions, /v1/runs/{run}/latest, .../versions/{v}/manifest
    files.py      GET|HEAD and PUT /v1/runs/{run}/versions/{v}/files/{name}: download (Range) and upload
    versions.py   POST .../commit, DELETE .../staging, PUT|DELETE .../pin
    deltas.py     GET .../versions/{v}/delta and .../delta/files/{name}: a version as a delta (written at commit)
    relay.py      GET .../versions/{v}/pieces, POST .../versions/{v}/relay: relay fan-out (piece digests, the chain)

A route reaches the service only through `weight_store/deps.py` (FastAPI `Depends` on `app.state`): the
`StoreState` and the token checks, which run before the route reads a body.
"""
