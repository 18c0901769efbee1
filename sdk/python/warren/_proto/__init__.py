"""Generated gRPC stubs of api/warren/v1/warren.proto (scripts/gen-proto-py.sh)."""
