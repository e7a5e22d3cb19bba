"""The Highwater client library: producer, consumer and admin client over gRPC."""
