package grpcapi_test

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/plover-run/plover/grpcapi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
)

// A call whose headers ask for gzip (grpc-encoding, its message itself
// sent uncompressed, which the server takes) is answered uncompressed, and
// its large answer holds its token's place as any other: answered in gzip,
// gRPC-Go compressed it into buffers of its own and freed the held ones as
// it queued them, so the place came back, and the write timeout stopped,
// before a byte was written (a review's probe: a token of concurrency 1
// held any number of such answers unread).
func TestAGzipCallsAnswerHoldsItsPlace(t *testing.T) {
	f := serveBigOpts(t, oneAtATime, grpcapi.Options{})
	c, err := net.Dial("tcp", f.conn.Target())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if enc := gzipCallUnread(t, c, "big", "Bearer one"); enc != "" && enc != "identity" {
		t.Fatalf("the answer to a call asking for gzip is in %q, want it uncompressed", enc)
	}
	_, err = f.client.ModelInfer(withToken(ctxT(t), "one"), rawCall("big", 10))
	if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "concurrency") {
		t.Fatalf("a second call while the gzip call's answer is unread: %v, want ResourceExhausted (the token's one place held)", err)
	}
}

// gzipCallUnread sends on c, over HTTP/2 by hand, a ModelInfer call of
// model with an answer of answerSize whose headers say grpc-encoding gzip
// and whose message is not compressed, and reads until the answer's
// headers come, but not its message: its stream's window (64 KiB) holds
// the rest in the server. It returns the answer's grpc-encoding.
func gzipCallUnread(t *testing.T, c net.Conn, model, authz string) string {
	t.Helper()
	c.Write([]byte(http2.ClientPreface))
	fr := http2.NewFramer(c, c)
	fr.WriteSettings()
	var hb bytes.Buffer
	he := hpack.NewEncoder(&hb)
	for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", pb.GRPCInferenceService_ModelInfer_FullMethodName},
		{":authority", "plover"}, {"content-type", "application/grpc"}, {"te", "trailers"}, {"authorization", authz}, {"grpc-encoding", "gzip"}} {
		he.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
	}
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
	req := rawCall(model, answerSize)
	rand.Read(req.RawInputContents[0]) // incompressible
	msg, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	frame := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg))) // flag 0: not compressed
	frame = append(frame, msg...)
	enc := ""
	hd := hpack.NewDecoder(4096, func(h hpack.HeaderField) {
		if h.Name == "grpc-encoding" {
			enc = h.Value
		}
	})
	connWin, strWin := int64(65535), int64(65535)
	for {
		for len(frame) > 0 && connWin > 0 && strWin > 0 {
			n := int(min(int64(len(frame)), 16384, connWin, strWin))
			fr.WriteData(1, n == len(frame), frame[:n])
			frame, connWin, strWin = frame[n:], connWin-int64(n), strWin-int64(n)
		}
		fm, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		switch fm := fm.(type) {
		case *http2.SettingsFrame:
			if !fm.IsAck() {
				fm.ForeachSetting(func(s http2.Setting) error {
					if s.ID == http2.SettingInitialWindowSize {
						strWin += int64(s.Val) - 65535
					}
					return nil
				})
				fr.WriteSettingsAck()
			}
		case *http2.WindowUpdateFrame:
			if fm.StreamID == 0 {
				connWin += int64(fm.Increment)
			} else {
				strWin += int64(fm.Increment)
			}
		case *http2.HeadersFrame:
			hd.Write(fm.HeaderBlockFragment())
			return enc
		case *http2.GoAwayFrame, *http2.RSTStreamFrame:
			t.Fatalf("the call was refused: %v", fm)
		}
	}
}
