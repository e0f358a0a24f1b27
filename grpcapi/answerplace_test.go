package grpcapi_test

import (
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/grpcapi"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
)

// answerSize is the size of the large answers here (big's, echoed): well
// past bigMessage, the smallest answer held until written. The host
// device lends no slots: these answers are copies (heldCopy); one
// written from its slot is place_internal_test.go's.
const answerSize = 1 << 20

// oneAtATime is a token table of one token, "one", of concurrency 1.
var oneAtATime = table{"one": {Name: "one", Scopes: auth.Invoke, Functions: []string{"*"}, Limits: auth.Limits{Concurrency: 1}}}

// dialAgain is another client connection to f's server, with opts.
func dialAgain(t *testing.T, f *fixture, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(f.conn.Target(), append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// A large answer keeps its call's place in its token's concurrency until
// gRPC-Go has written it, or dropped it with its connection: given back as
// the handler returned, a token of concurrency 1 could have any number of
// large answers held in the server for clients that do not read them.
// Once the connection that held one is closed, by its client or by the
// server at its write timeout, the place is free again, whether or not
// what gRPC-Go dropped with the connection has been collected (the
// runtime's own collections are off, as on a server at rest, and an idle
// stream worker of gRPC-Go's keeps its last stream: the token's own calls,
// refused, would never make it let go).
func TestALargeAnswerHoldsItsTokensPlaceUntilGivenBack(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	for _, tc := range []struct {
		name         string
		model        string
		writeTimeout time.Duration // 0: the default, 60 s
		clientCloses bool
	}{
		{"its client closes the connection", "big", 0, true},
		{"a pipeline's, its client closes the connection", "pbig", 0, true},
		{"closed by the server at its write timeout", "big", 5 * time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := serveBigOpts(t, oneAtATime, grpcapi.Options{WriteTimeout: tc.writeTimeout})
			ctx := withToken(ctxT(t), "one")
			// A client that does not read: its stream's window (64 KiB,
			// no growing) holds the rest of the answer in the server.
			slow := dialAgain(t, f, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
			cs, err := slow.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, pb.GRPCInferenceService_ModelInfer_FullMethodName)
			if err != nil {
				t.Fatal(err)
			}
			if err := cs.SendMsg(rawCall(tc.model, answerSize)); err != nil {
				t.Fatal(err)
			}
			cs.CloseSend()
			if _, err := cs.Header(); err != nil { // sent with the answer's first bytes: the handler returned
				t.Fatal(err)
			}
			_, err = f.client.ModelInfer(ctx, rawCall(tc.model, answerSize))
			if st, _ := status.FromError(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "concurrency") {
				t.Fatalf("a second call while the first's answer is unread: %v, want ResourceExhausted (the token's one place held)", err)
			}
			if tc.clientCloses {
				slow.Close()
			}
			for end := time.Now().Add(15 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				_, err := f.client.ModelInfer(ctx, rawCall(tc.model, answerSize))
				if err == nil {
					break
				}
				if status.Code(err) != codes.ResourceExhausted || time.Now().After(end) {
					t.Fatalf("a call once the first answer's connection is closed: %v", err)
				}
			}
		})
	}
}

// A client calling one at a time with large answers is never refused for
// its token's concurrency by its own previous call: gRPC-Go frees an
// answer before it writes its call's status, on the call's connection or
// (the next call on a new one) not.
func TestLargeAnswersOneAtATimeAreNeverRefused(t *testing.T) {
	f := serveBigOpts(t, oneAtATime, grpcapi.Options{})
	ctx := withToken(ctxT(t), "one")
	models := []string{"big", "pbig"}
	call := func(client pb.GRPCInferenceServiceClient, i int, where string) {
		t.Helper()
		r, err := client.ModelInfer(ctx, rawCall(models[i%2], answerSize))
		if err != nil {
			t.Fatalf("call %d %s, the one before it answered: %v", i, where, err)
		}
		if out := r.GetRawOutputContents(); len(out) != 1 || len(out[0]) != answerSize {
			t.Fatalf("call %d %s: not its answer", i, where)
		}
	}
	for i := range 15 {
		call(f.client, i, "on one connection")
	}
	for i := range 10 {
		conn := dialAgain(t, f)
		call(pb.NewGRPCInferenceServiceClient(conn), i, "on a new connection")
		conn.Close()
	}
}
