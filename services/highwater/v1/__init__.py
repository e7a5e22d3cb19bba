"""Generated protobuf and gRPC stubs for highwater.v1."""
