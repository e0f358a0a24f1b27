package grpcapi

import (
	"errors"
	"io"

	"google.golang.org/grpc/encoding/gzip"
)

// refuseCompressed is the server's decompressor for gzip, the one
// compression the binary links (through the OTLP exporter's gRPC
// client, which registers it for every gRPC server in the process): it
// inflates nothing. A gzip message of 200 KB inflated to the receive
// limit (--max-body and its envelope) before any check of Plover's ran,
// on the methods open without a token too: 620 MB of memory and 0.9 s
// of CPU a call, where the strangers' bound (4 calls from a client, 1 s
// for their message) assumed the client sent the bytes it cost. An
// inference input does not compress well enough to be worth a bound of
// its own; clients send messages uncompressed. gRPC-Go refuses a call
// compressed in any other way itself, as no decompressor is installed
// for it (TestOnlyGzipIsRegistered keeps it so).
type refuseCompressed struct{}

var errCompressed = errors.New("plover accepts no compressed messages (grpc-encoding gzip): send them uncompressed")

func (refuseCompressed) Do(io.Reader) ([]byte, error) { return nil, errCompressed }
func (refuseCompressed) Type() string                 { return gzip.Name }
