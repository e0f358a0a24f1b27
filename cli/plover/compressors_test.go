package main_test

import (
	"testing"

	"google.golang.org/grpc/encoding"
)

// The gRPC server refuses gzip messages by the one decompressor it can
// set (grpcapi's refuseCompressed); a compressor of any other name
// linked into plover (a dependency registering one, as the OTLP
// exporter's client registers gzip) would inflate a call's message
// before any check. This test binary links what plover links.
func TestOnlyGzipIsRegistered(t *testing.T) {
	for _, name := range []string{"deflate", "zstd", "snappy", "x-snappy-framed", "br", "lz4", "zlib", "s2"} {
		if encoding.GetCompressor(name) != nil {
			t.Errorf("a gRPC compressor %q is registered: grpcapi inflates its messages unbounded by the refusal of gzip", name)
		}
	}
	if encoding.GetCompressor("gzip") == nil {
		t.Log("gzip is not registered (the OTLP exporter no longer links it): the refusal stays harmless")
	}
}
