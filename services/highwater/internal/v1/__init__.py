"""Generated protobuf and gRPC stubs of the services' own API, highwater.internal.v1."""
