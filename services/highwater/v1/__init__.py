"""Generated protobuf and gRPC stubs of the client-facing API, highwater.v1."""
