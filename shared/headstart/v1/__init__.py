"""Generated gRPC stubs of protos/headstart/v1 (scripts/gen_protos.py; do not edit)."""
