package grpcapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
)

// A call's raw inputs are decoded where they lie in its message, not
// copied: whatever the fields' order, the request decodes as proto would
// decode it, each raw input within the message's bytes.
func TestRawInputsStayInTheMessage(t *testing.T) {
	c := newCodec(New(nil, Options{MaxMessageBytes: 64 << 20}))
	head := &pb.ModelInferRequest{ModelName: "f", Id: "7",
		Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "A", Datatype: "UINT8", Shape: []int64{3}}, {Name: "B", Datatype: "UINT8", Shape: []int64{5000}}}}
	headWire, _ := proto.Marshal(head)
	raw := raw7
	a, b := []byte{1, 2, 3}, bytes.Repeat([]byte{9}, 5000)
	for _, tc := range []struct {
		name string
		wire []byte
		raws int
	}{
		{"no raw inputs", headWire, 0},
		{"raw inputs last", cat(headWire, raw(a), raw(b)), 2},
		{"raw inputs first", cat(raw(a), raw(b), headWire), 2},
		{"raw inputs between fields", cat(headWire[:3], raw(a), headWire[3:], raw(b)), 2},
		{"an empty raw input", cat(headWire, raw(nil)), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var want pb.ModelInferRequest
			if err := proto.Unmarshal(tc.wire, &want); err != nil {
				t.Fatal(err)
			}
			var got pb.ModelInferRequest
			if !c.decodeInfer(tc.wire, &got, true) {
				t.Fatalf("refused: %v", takeRefusalOf(&c.s.refused, &got))
			}
			if !proto.Equal(&got, &want) {
				t.Fatalf("decoded %v, proto decodes %v", &got, &want)
			}
			if len(got.RawInputContents) != tc.raws {
				t.Fatalf("%d raw inputs, want %d", len(got.RawInputContents), tc.raws)
			}
			for i, r := range got.RawInputContents {
				if len(r) > 0 && !within(r, tc.wire) {
					t.Errorf("raw input %d was copied out of the message", i)
				}
			}
		})
	}
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// A message that came in many buffers is decoded with its raw inputs left
// in them: cut anywhere (a varint, a tag, an input across buffers), the
// call's request is proto's, its raw inputs the pieces of the buffers
// that hold them; a message the walk cannot read whole (cut short, a
// group, field 0, a length past its end or past 64 bits) is left to
// proto, whose refusal
// the call gets, and so is one whose other fields pass 64 KiB.
func TestRawInputsStayInTheirBuffers(t *testing.T) {
	c := newCodec(New(nil, Options{MaxMessageBytes: 64 << 20}))
	req := &pb.ModelInferRequest{ModelName: "f", Id: "7",
		Inputs:           []*pb.ModelInferRequest_InferInputTensor{{Name: "A", Datatype: "UINT8", Shape: []int64{3}}, {Name: "B", Datatype: "UINT8", Shape: []int64{70000}}, {Name: "C", Datatype: "UINT8", Shape: []int64{0}}},
		Parameters:       map[string]*pb.InferParameter{"p": {ParameterChoice: &pb.InferParameter_Int64Param{Int64Param: -3}}},
		RawInputContents: [][]byte{{1, 2, 3}, bytes.Repeat([]byte{5, 6, 7}, 70000/3+1)[:70000], {}}}
	wire, _ := proto.Marshal(req)
	wire = cat(raw7([]byte{8}), wire) // a raw input first, then the rest
	var want pb.ModelInferRequest
	if err := proto.Unmarshal(wire, &want); err != nil {
		t.Fatal(err)
	}
	for _, cut := range []int{1, 2, 3, 7, 1000, 16 << 10} {
		t.Run(fmt.Sprintf("cut every %d bytes", cut), func(t *testing.T) {
			call := new(inferCall)
			if err := c.Unmarshal(cutInto(wire, cut), call); err != nil || takeRefusalOf(&c.s.refused, &call.req) != nil {
				t.Fatalf("refused: %v", err)
			}
			defer call.inputsDone()
			raw := rawInputs{whole: call.req.RawInputContents, pieces: call.io.pieces}
			if call.io.pieces == nil || raw.count() != len(want.RawInputContents) {
				t.Fatalf("%d raw inputs in pieces (%v), want %d", raw.count(), call.io.pieces != nil, len(want.RawInputContents))
			}
			for i, w := range want.RawInputContents {
				if got := raw.appendTo(nil, i); !bytes.Equal(got, w) || raw.size(i) != len(w) || !bytes.Equal(raw.one(i), w) {
					t.Errorf("raw input %d: %d bytes, not its %d", i, len(got), len(w))
				}
			}
			got := proto.Clone(&call.req).(*pb.ModelInferRequest)
			got.RawInputContents = want.RawInputContents
			if !proto.Equal(got, &want) {
				t.Fatalf("decoded %v, proto decodes %v", got, &want)
			}
			if call.io.size != len(wire) {
				t.Errorf("the message's size %d, want %d", call.io.size, len(wire))
			}
		})
	}
	for _, tc := range []struct {
		name    string
		wire    []byte
		refused bool
	}{
		{"cut short", wire[:len(wire)-1], true},
		{"a group (proto keeps it, unknown)", cat(wire, []byte{0x0b, 0x0c}), false},
		{"field 0", cat([]byte{0x02, 0x00}, wire), true},
		{"a raw input past the end", cat(wire, []byte{0x3a, 0x7f, 1}), true},
		{"a raw input's length past 64 bits", cat(wire, []byte{0x3a, 0x83, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02, 1, 2, 3}), true},
		{"other fields past 64 KiB (joined whole)", cat(wire, protowire.AppendString(protowire.AppendTag(nil, 3, protowire.BytesType), strings.Repeat("i", 100<<10))), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			call := new(inferCall)
			if err := c.Unmarshal(cutInto(tc.wire, 1000), call); err != nil {
				t.Fatal(err)
			}
			defer call.inputsDone()
			if err := takeRefusalOf(&c.s.refused, &call.req); (err != nil) != tc.refused || call.io.pieces != nil {
				t.Fatalf("refused: %v, want %v; pieces kept %v", err, tc.refused, call.io.pieces != nil)
			}
			if !tc.refused && len(call.req.RawInputContents) != len(want.RawInputContents) {
				t.Fatalf("%d raw inputs decoded whole, want %d", len(call.req.RawInputContents), len(want.RawInputContents))
			}
		})
	}
}

// raw7 is a raw_input_contents entry.
func raw7(b []byte) []byte {
	w := protowire.AppendTag(nil, 7, protowire.BytesType)
	return protowire.AppendBytes(w, b)
}

// cutInto is b in buffers of n bytes (copied: the codec keeps them).
func cutInto(b []byte, n int) mem.BufferSlice {
	var s mem.BufferSlice
	for len(b) > 0 {
		k := min(n, len(b))
		s = append(s, mem.SliceBuffer(bytes.Clone(b[:k])))
		b = b[k:]
	}
	return s
}

// within reports whether b lies in m's memory.
func within(b, m []byte) bool {
	p, lo := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(unsafe.SliceData(m)))
	return p >= lo && p+uintptr(len(b)) <= lo+uintptr(len(m))
}

// countedLanding is a slot that counts its release and discard.
type countedLanding struct {
	mem                 []byte
	released, discarded atomic.Int32
}

func (l *countedLanding) Input() []byte  { return l.mem }
func (l *countedLanding) Output() []byte { return l.mem }
func (l *countedLanding) Release()       { l.released.Add(1) }
func (l *countedLanding) Discard()       { l.discarded.Add(1) }

// An answer cut from a slot is encoded whole. On a connection the server
// follows, its raw outputs of slotOutput or more are written from the
// slot, which is given back once, when gRPC-Go frees the last of them;
// elsewhere (and where every output is small) they are copied and the slot
// given back as the answer is encoded. A call never encoded (gRPC-Go drops
// it) gives its slot back when it is collected.
func TestEncodingAnAnswerGivesItsSlotBack(t *testing.T) {
	srv := New(nil, Options{})
	c := newCodec(srv)
	sc, _ := connPair(t, &srv.conns)
	followed := &peer.Peer{Addr: sc.RemoteAddr(), LocalAddr: sc.LocalAddr()}
	slot := make([]byte, 1<<20)
	for i := range slot {
		slot[i] = byte(i * 7)
	}
	for _, tc := range []struct {
		name  string
		cuts  [][2]int // each raw output's bounds in the slot
		typed bool
	}{
		{"one large output", [][2]int{{0, 300 << 10}}, false},
		{"small outputs", [][2]int{{0, 10}, {10, 4000}}, false},
		{"small outputs, 80,000 bytes in all: copied, bounded", [][2]int{
			{0, 4000}, {4000, 8000}, {8000, 12000}, {12000, 16000}, {16000, 20000}, {20000, 24000}, {24000, 28000}, {28000, 32000}, {32000, 36000}, {36000, 40000},
			{40000, 44000}, {44000, 48000}, {48000, 52000}, {52000, 56000}, {56000, 60000}, {60000, 64000}, {64000, 68000}, {68000, 72000}, {72000, 76000}, {76000, 80000}}, false},
		{"small and large, out of order", [][2]int{{600 << 10, 601 << 10}, {0, 200 << 10}, {5, 9}, {200 << 10, 600 << 10}}, false},
		{"typed outputs", nil, true},
	} {
		for _, p := range []*peer.Peer{nil, followed} {
			t.Run(fmt.Sprintf("%s, connection followed %v", tc.name, p != nil), func(t *testing.T) {
				land := &countedLanding{mem: slot}
				resp := &pb.ModelInferResponse{ModelName: "f", Id: "x", ModelVersion: "v"}
				large := false
				for i, cut := range tc.cuts {
					resp.Outputs = append(resp.Outputs, &pb.ModelInferResponse_InferOutputTensor{Name: string(rune('A' + i)), Datatype: "UINT8", Shape: []int64{int64(cut[1] - cut[0])}})
					resp.RawOutputContents = append(resp.RawOutputContents, slot[cut[0]:cut[1]])
					large = large || cut[1]-cut[0] >= slotOutput
				}
				if tc.typed {
					resp.Outputs = []*pb.ModelInferResponse_InferOutputTensor{{Name: "A", Datatype: "INT32", Shape: []int64{2},
						Contents: &pb.InferTensorContents{IntContents: []int32{-1, 5}}}}
				}
				want := proto.Clone(resp)
				call := &inferCall{resp: resp, io: inferIO{land: &lent{Landing: land}, peer: p}}
				out, err := c.Marshal(call)
				if err != nil {
					t.Fatal(err)
				}
				fromSlot := p != nil && large
				if n := land.released.Load(); int(n) != btoi(!fromSlot) || land.discarded.Load() != 0 {
					t.Fatalf("released %d times, discarded %d, once encoded", n, land.discarded.Load())
				}
				// Written from the slot, or copied and of bigMessage or
				// more: bounded, counted on its connection until freed.
				bounded := p != nil && (large || out.Len() >= bigMessage)
				if n := sc.answers.Load(); int(n) != btoi(bounded) {
					t.Fatalf("its connection counts %d answers held, want %d", n, btoi(bounded))
				}
				inSlot := 0
				for _, b := range out {
					if data := b.ReadOnlyData(); len(data) > 0 && within(data, slot) {
						if len(data) < slotOutput {
							t.Fatalf("a buffer of %d bytes over the slot: smaller than slotOutput", len(data))
						}
						inSlot++
					}
				}
				if (inSlot > 0) != fromSlot {
					t.Fatalf("%d of the message's buffers over the slot", inSlot)
				}
				var got pb.ModelInferResponse
				if err := proto.Unmarshal(out.Materialize(), &got); err != nil || !proto.Equal(&got, want) {
					t.Fatalf("the message decodes to %v (%v), want %v", &got, err, want)
				}
				for i, b := range out {
					if b.Free(); i < len(out)-1 && int(land.released.Load()) != btoi(!fromSlot) {
						t.Fatalf("released with %d of the message's buffers not yet freed", len(out)-1-i)
					}
				}
				if n := land.released.Load(); n != 1 || sc.answers.Load() != 0 {
					t.Fatalf("released %d times once the message was freed, %d answers counted held", n, sc.answers.Load())
				}
			})
		}
	}
	// Through the handler: a call that failed gives its slot back at once;
	// one whose answer gRPC-Go drops unencoded, once it is collected.
	for _, failed := range []bool{true, false} {
		t.Run(fmt.Sprintf("handled, failed %v", failed), func(t *testing.T) {
			land := &countedLanding{mem: slot}
			interceptor := func(_ context.Context, req any, _ *grpc.UnaryServerInfo, _ grpc.UnaryHandler) (any, error) {
				// The request is its call's first field (inferCall).
				(*inferCall)(unsafe.Pointer(req.(*pb.ModelInferRequest))).io.land = &lent{Landing: land}
				if failed {
					return nil, badRequest("no")
				}
				return &pb.ModelInferResponse{}, nil
			}
			func() {
				reply, err := inferHandler(New(nil, Options{}), context.Background(), func(any) error { return nil }, interceptor)
				if _, ok := reply.(*inferCall); ok == failed || (err != nil) != failed {
					t.Fatalf("reply %T, %v", reply, err)
				}
			}()
			if failed && land.released.Load() != 1 {
				t.Fatalf("a failed call released its slot %d times", land.released.Load())
			}
			for end := time.Now().Add(10 * time.Second); land.released.Load() == 0 && time.Now().Before(end); {
				runtime.GC()
				time.Sleep(10 * time.Millisecond)
			}
			if n := land.released.Load(); n != 1 || land.discarded.Load() != 0 {
				t.Fatalf("released %d times, discarded %d, once the call was dropped", n, land.discarded.Load())
			}
		})
	}
}

// An answer written from its slot holds the slot until gRPC-Go frees it,
// and a large one copied holds the server's memory, which a client that
// does not read may put off for ever: past the write timeout its
// connection is closed, and the slot comes back once gRPC-Go frees what it
// held. An answer freed in time closes nothing.
func TestAnAnswerHeldPastTheWriteTimeoutClosesItsConnection(t *testing.T) {
	const timeout = 100 * time.Millisecond
	srv := New(nil, Options{WriteTimeout: timeout})
	c := newCodec(srv)
	slot := make([]byte, 64<<10)
	for i := range slot {
		slot[i] = byte(i * 3)
	}
	// An answer from its slot, and one copied (no slot: a pipeline's, a
	// typed one): the same bound for both.
	for _, fromSlot := range []bool{true, false} {
		t.Run(fmt.Sprintf("from its slot %v", fromSlot), func(t *testing.T) {
			resp := &pb.ModelInferResponse{ModelName: "f", RawOutputContents: [][]byte{slot}}
			want, _ := proto.Marshal(resp)
			answer := func(sc *turnConn) (mem.BufferSlice, *countedLanding) {
				land := &countedLanding{mem: slot}
				call := &inferCall{io: inferIO{peer: &peer.Peer{Addr: sc.RemoteAddr(), LocalAddr: sc.LocalAddr()}}, resp: resp}
				if fromSlot {
					call.io.land = &lent{Landing: land}
				}
				out, err := c.Marshal(call)
				if err != nil {
					t.Fatal(err)
				}
				return out, land
			}
			held, heldClient := connPair(t, &srv.conns)
			freed, freedClient := connPair(t, &srv.conns)
			out2, _ := answer(freed)
			out2.Free()
			out, land := answer(held)
			if !bytes.Equal(out.Materialize(), want) {
				t.Fatal("the answer is not its message")
			}
			if n := freed.answers.Load(); n != 0 {
				t.Fatalf("a connection whose answer was freed counts %d answers held", n)
			}
			// The held answer's connection ends: its client reads its end.
			heldClient.SetReadDeadline(time.Now().Add(10 * time.Second))
			if n, err := heldClient.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the connection of an answer held past the write timeout: read %d, %v; want its end", n, err)
			}
			// Held: its slot (or copy: no slot) still out, counted on its
			// connection; freed: its slot given back (or its copy to
			// gRPC-Go's pool: the count is the copy's lent's), once.
			if n := land.released.Load(); n != 0 {
				t.Fatalf("the slot was given back %d times while gRPC-Go held the answer", n)
			}
			if n := held.answers.Load(); n != 1 {
				t.Fatalf("the closed connection counts %d answers held, want 1", n)
			}
			out.Free()
			if n := land.released.Load(); n != int32(btoi(fromSlot)) || held.answers.Load() != 0 {
				t.Fatalf("the slot was given back %d times once the answer was freed, its connection counting %d answers held", n, held.answers.Load())
			}
			// The other answer was freed at once: 10 times its write
			// timeout later its connection is still open.
			freedClient.SetReadDeadline(time.Now().Add(10 * timeout))
			if _, err := freedClient.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) || freed.closed.Load() {
				t.Fatalf("the connection of an answer freed in time: %v (closed %v), want it open", err, freed.closed.Load())
			}
		})
	}
}

// An answer that gRPC-Go dropped unfreed (a frame queued as its client
// reset the stream, or its connection closed by its client) is still
// held, for all the server knows, at its write timeout: it is judged
// after a collection, which the server asks for (here the only one: the
// runtime's own are off, as on a server at rest), frees it, and closes
// nothing.
func TestAnAnswerDroppedUnfreedIsFreedClosingNothing(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	for _, clientClosed := range []bool{false, true} {
		t.Run(fmt.Sprintf("closed by its client %v", clientClosed), func(t *testing.T) {
			var log testkit.LogBuffer
			srv := New(nil, Options{WriteTimeout: 100 * time.Millisecond, Log: slog.New(slog.NewTextHandler(&log, nil))})
			c := newCodec(srv)
			sc, client := connPair(t, &srv.conns)
			slot := make([]byte, 64<<10)
			land := &countedLanding{mem: slot}
			func() {
				call := &inferCall{io: inferIO{land: &lent{Landing: land}, peer: &peer.Peer{Addr: sc.RemoteAddr(), LocalAddr: sc.LocalAddr()}},
					resp: &pb.ModelInferResponse{ModelName: "f", RawOutputContents: [][]byte{slot}}}
				if _, err := c.Marshal(call); err != nil { // and dropped
					t.Fatal(err)
				}
			}()
			if clientClosed {
				sc.Close()
			}
			running := func() bool {
				srv.held.mu.Lock()
				defer srv.held.mu.Unlock()
				return srv.held.running
			}
			for end := time.Now().Add(10 * time.Second); land.released.Load() == 0 || running(); time.Sleep(time.Millisecond) {
				if time.Now().After(end) {
					t.Fatalf("10 s after its write timeout: the slot given back %d times, the server's loop running %v", land.released.Load(), running())
				}
			}
			if n := land.released.Load(); n != 1 || sc.answers.Load() != 0 || strings.Contains(log.String(), "closed a gRPC connection") {
				t.Fatalf("the slot given back %d times, %d answers counted held; the server's log:\n%s", n, sc.answers.Load(), log.String())
			}
			if !clientClosed {
				client.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
				if _, err := client.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) || sc.closed.Load() {
					t.Fatalf("the connection of an answer dropped and freed: %v (closed %v), want it open", err, sc.closed.Load())
				}
			}
		})
	}
}

// A panic while an answer is encoded (recoveringCodec recovers it), or an
// error, gives its slot back, on a connection the server follows or not.
func TestAPanicEncodingAnAnswerGivesItsSlotBack(t *testing.T) {
	srv := New(nil, Options{})
	c := newCodec(srv)
	sc, _ := connPair(t, &srv.conns)
	slot := make([]byte, 64<<10)
	for _, p := range []*peer.Peer{nil, {Addr: sc.RemoteAddr(), LocalAddr: sc.LocalAddr()}} {
		land := &countedLanding{mem: slot}
		call := &inferCall{io: inferIO{land: &lent{Landing: land}, peer: p}} // no answer: encoding it panics
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("encoding a call with no answer did not panic")
				}
			}()
			c.Marshal(call)
		}()
		if n := land.released.Load(); n != 1 {
			t.Fatalf("connection followed %v: the slot was given back %d times after a panic", p != nil, n)
		}
		// A model name proto refuses (not UTF-8) fails the encoding of
		// the answer's other fields, after its connection was found.
		land = &countedLanding{mem: slot}
		call = &inferCall{io: inferIO{land: &lent{Landing: land}, peer: p},
			resp: &pb.ModelInferResponse{ModelName: "\xff", RawOutputContents: [][]byte{slot}}}
		if _, err := c.Marshal(call); err == nil {
			t.Fatal("an answer with a model name not UTF-8 was encoded")
		}
		if n := land.released.Load(); n != 1 || sc.answers.Load() != 0 {
			t.Fatalf("connection followed %v: the slot was given back %d times after an error, %d answers counted held", p != nil, n, sc.answers.Load())
		}
	}
}
