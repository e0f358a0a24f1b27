package grpcapi

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/peer"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/gate"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
)

// oneToken knows one token, "one", of concurrency 1.
type oneToken struct{}

func (oneToken) Lookup(tok []byte) *auth.Principal {
	if string(tok) != "one" {
		return nil
	}
	return &auth.Principal{Name: "one", Scopes: auth.Invoke, Functions: []string{"*"}, Limits: auth.Limits{Concurrency: 1}}
}

// places is a gate of oneToken: take takes its place (nil where it is
// taken), and back fails unless it was given back exactly once (a place
// given back twice lets two calls in).
type places struct {
	t *testing.T
	g *gate.Gate
}

func newPlaces(t *testing.T) places { return places{t, gate.New(oneToken{}, prometheus.NewRegistry())} }

func (p places) take() *place {
	tk, r := p.g.Hold([]byte("Bearer one"))
	if r != nil {
		return nil
	}
	return &place{tk: tk}
}

func (p places) taken(what string) {
	p.t.Helper()
	if pl := p.take(); pl != nil {
		pl.giveBack()
		p.t.Fatalf("%s: the token's place is free, want it held", what)
	}
}

func (p places) back(what string) {
	p.t.Helper()
	first := p.take()
	if first == nil {
		p.t.Fatalf("%s: the token's place is still held", what)
	}
	defer first.giveBack()
	if second := p.take(); second != nil {
		second.giveBack()
		p.t.Fatalf("%s: a second call was let in beside the first: the place was given back twice", what)
	}
}

// backOnceCollected collects until the place is back (gRPC-Go dropped
// what held it), failing past 10 s.
func (p places) backOnceCollected(what string) {
	p.t.Helper()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		runtime.GC()
		if pl := p.take(); pl != nil {
			pl.giveBack()
			break
		}
		if time.Now().After(end) {
			p.t.Fatalf("%s: the token's place is still held 10 s on", what)
		}
	}
	p.back(what)
}

// ending is how an answer held ends.
type ending int

const (
	freed      ending = iota // gRPC-Go frees its buffers (written, or its stream reset)
	collected                // gRPC-Go drops them unfreed, and they are collected
	connClosed               // its connection closes, and then they are freed
)

// An answer held (written from its slot, or copied and of bigMessage or
// more, on a connection the server follows) keeps its call's place in its
// token's concurrency until gRPC-Go frees it, or drops it and it is
// collected, or its connection closes; any other answer gives it back as
// it is encoded, a panic or an error encoding it too. Each gives it back
// once.
func TestAnAnswerHeldKeepsItsCallsPlace(t *testing.T) {
	srv := New(nil, Options{})
	marshal := func(call *inferCall) (out mem.BufferSlice, err error) {
		defer func() { // as recoveringCodec
			if v := recover(); v != nil {
				err = fmt.Errorf("panicked: %v", v)
			}
		}()
		return newCodec(srv).Marshal(call)
	}
	slot := make([]byte, 256<<10)
	answer := func(out []byte) *pb.ModelInferResponse {
		return &pb.ModelInferResponse{ModelName: "f", RawOutputContents: [][]byte{out}}
	}
	for _, tc := range []struct {
		name     string
		resp     *pb.ModelInferResponse // nil: encoding it panics
		slot     bool
		followed bool   // its connection
		held     bool   // the place kept until the message is freed
		end      ending // of a message held
	}{
		{"from its slot", answer(slot), true, true, true, freed},
		{"from its slot, dropped unfreed", answer(slot), true, true, true, collected},
		{"from its slot, its connection closed", answer(slot), true, true, true, connClosed},
		{"copied, 64 KiB or more", answer(slot[:bigMessage]), false, true, true, freed},
		{"copied, 64 KiB or more, dropped unfreed", answer(slot[:bigMessage]), false, true, true, collected},
		{"copied, 64 KiB or more, its connection closed", answer(slot[:bigMessage]), false, true, true, connClosed},
		{"copied, small", answer(slot[:4<<10]), false, true, false, freed},
		{"large, its connection not followed", answer(slot), true, false, false, freed},
		{"a panic encoding it", nil, true, true, false, freed},
		{"an error encoding it", &pb.ModelInferResponse{ModelName: "\xff", RawOutputContents: [][]byte{slot}}, true, true, false, freed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPlaces(t)
			sc, _ := connPair(t, &srv.conns)
			call := &inferCall{resp: tc.resp, io: inferIO{place: p.take()}}
			if tc.followed {
				call.io.peer = &peer.Peer{Addr: sc.RemoteAddr(), LocalAddr: sc.LocalAddr()}
			}
			if tc.slot {
				call.io.land = &lent{Landing: &countedLanding{mem: slot}}
			}
			func() {
				out, err := marshal(call)
				if (err != nil) != (tc.resp == nil || tc.resp.ModelName != "f") {
					t.Fatalf("encoded: %v", err)
				}
				if !tc.held {
					p.back("encoded")
					out.Free()
					return
				}
				p.taken("encoded, not yet freed")
				switch tc.end {
				case freed:
					for _, b := range out[:len(out)-1] {
						b.Free()
					}
					p.taken("its last buffer not yet freed")
					out[len(out)-1].Free()
					p.back("freed")
				case connClosed: // before the message is freed, not again after
					sc.Close()
					p.back("its connection closed")
					out.Free()
					p.back("its connection closed, then freed")
				}
			}()
			if tc.end == collected {
				p.backOnceCollected("dropped unfreed")
			}
			if n := sc.answers.Load(); n != 0 {
				t.Fatalf("%d answers counted held on the connection", n)
			}
		})
	}
}

// ModelInfer's handler takes its call's place over from the tap's pending
// (handOver), so that admit's release, as it returns, gives none back: a
// call that failed gives it back as its handler returns; one answered, as
// its answer is encoded, or, where gRPC-Go drops it unencoded, once it is
// collected.
func TestModelInferTakesItsPlaceOver(t *testing.T) {
	for _, tc := range []struct {
		name   string
		failed bool
		encode bool
	}{
		{"failed", true, false},
		{"answered, encoded", false, true},
		{"answered, dropped unencoded", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPlaces(t)
			pend := &pending{timer: time.NewTimer(time.Hour), place: p.take()}
			ctx := context.WithValue(context.Background(), pendingKey{}, pend)
			// As admit runs the handler: the handler takes the place
			// over, and admit's release, once it returns, gives back the
			// rest.
			interceptor := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, _ grpc.UnaryHandler) (any, error) {
				defer pend.release()
				call := (*inferCall)(unsafe.Pointer(req.(*pb.ModelInferRequest))) // its first field
				call.io.place = handOver(ctx)
				call.io.land = &lent{Landing: &countedLanding{}} // answered to the codec (not a bare response)
				if tc.failed {
					return nil, badRequest("no")
				}
				p.taken("handed over, admit's release run")
				return &pb.ModelInferResponse{ModelName: "f"}, nil
			}
			srv := New(nil, Options{})
			func() {
				reply, err := inferHandler(srv, ctx, func(any) error { return nil }, interceptor)
				if tc.failed {
					if err == nil {
						t.Fatal("a failed call answered")
					}
					p.back("failed")
					return
				}
				call, ok := reply.(*inferCall)
				if !ok || err != nil {
					t.Fatalf("reply %T, %v", reply, err)
				}
				p.taken("answered, not yet encoded")
				if tc.encode {
					out, err := newCodec(srv).Marshal(call)
					if err != nil {
						t.Fatal(err)
					}
					out.Free()
					p.back("encoded")
				}
			}()
			if !tc.failed && !tc.encode {
				p.backOnceCollected("dropped unencoded")
			}
		})
	}
}
