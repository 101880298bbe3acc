"""The session router: binds each whole session to one complete worker and proxies to it.

Modules: table (worker table), binding (where a request goes), sources and k8s_source (where the
table comes from), health (active /ready checks), http_proxy and ws_relay (the data path), app
(the ASGI application with /health, /ready, /metrics and /admin), main (`omni router`), bench
(router overhead benchmark). No torch or transformers here (.importlinter).
"""
