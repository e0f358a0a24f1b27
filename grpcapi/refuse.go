package grpcapi

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"strconv"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"

	"github.com/plover-run/plover/netguard"
)

// refuseRead bounds what Refuse reads of a refused client: its preface,
// settings and first call's headers fit many times over.
const refuseRead = 64 << 10

// Refuse answers the first call on c, a connection the server will not
// serve (one past its connection cap), with UNAVAILABLE saying msg, then
// closes c. Closed at once, a gRPC client reported only "connection
// reset" or "the connection is draining", naming no limit. It speaks just
// enough HTTP/2 for that: its settings, an acknowledgement of the
// client's, the call's trailers and a GOAWAY that leaves the client's
// later calls unprocessed (a client retries those on a new connection).
// Refuse gives up at deadline, and on anything but HTTP/2's preface.
func Refuse(c net.Conn, msg string, deadline time.Time) {
	defer c.Close()
	if c.SetDeadline(deadline) != nil {
		return
	}
	in := bufio.NewReader(io.LimitReader(c, refuseRead))
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(in, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	fr := http2.NewFramer(c, in)
	// A frame's buffer is made at the length its header claims, before
	// its body is read: at the default bound, 16 MiB for a header of 9
	// bytes. 16 KiB is HTTP/2's initial SETTINGS_MAX_FRAME_SIZE, which
	// the settings sent here leave as it is: a client may send no more.
	fr.SetMaxReadFrameSize(16 << 10)
	if fr.WriteSettings() != nil {
		return
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() && fr.WriteSettingsAck() != nil {
				return
			}
		case *http2.HeadersFrame:
			if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: f.StreamID, BlockFragment: unavailable(msg),
				EndStream: true, EndHeaders: true}) != nil || fr.WriteGoAway(f.StreamID, http2.ErrCodeNo, nil) != nil {
				return
			}
			netguard.CloseLingering(c, in)
			return
		}
	}
}

// unavailable is a call's trailers alone (a gRPC "trailers-only" answer):
// status UNAVAILABLE with msg, HPACK-encoded.
func unavailable(msg string) []byte {
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	for _, f := range [...]hpack.HeaderField{
		{Name: ":status", Value: "200"},
		{Name: "content-type", Value: "application/grpc"},
		{Name: "grpc-status", Value: strconv.Itoa(int(codes.Unavailable))},
		{Name: "grpc-message", Value: percentEncode(msg)},
	} {
		enc.WriteField(f)
	}
	return b.Bytes()
}

// percentEncode writes msg as grpc-message carries it: printable ASCII
// but '%' as is, every other byte as %XX.
func percentEncode(msg string) string {
	var b []byte
	for i := 0; i < len(msg); i++ {
		switch c := msg[i]; {
		case c >= ' ' && c <= '~' && c != '%':
			b = append(b, c)
		default:
			b = append(b, '%', "0123456789ABCDEF"[c>>4], "0123456789ABCDEF"[c&15])
		}
	}
	return string(b)
}
