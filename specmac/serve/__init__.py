"""specmac serve: an OpenAI-compatible HTTP server over one pair (starlette + uvicorn).

schema.py checks request bodies, text.py turns ids into safe text pieces (stop strings), worker.py
owns the pair on one thread with a bounded FIFO queue, app.py holds the routes, metrics.py the
Prometheus counters, server.py binds and runs uvicorn. Needs the ``serve`` extra.
"""
