"""The table-cache service: its own process that fills the block store engines read.

    settings.py   TableCacheSettings (env HEADSTART_TABLECACHE_*)
    registry.py   which databases are registered, and at which schema hash
    core.py       register / precompute / status / invalidate / clean orphans
    server.py     the gRPC server (headstart.v1.TableCache, health, reflection)
    register.py   the client the chart's post-install Job runs
"""
