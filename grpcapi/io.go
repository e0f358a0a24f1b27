package grpcapi

import (
	"context"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/gate"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/ioshare"
)

// A ModelInfer call's bytes are its function's share of the server's I/O
// (package ioshare), as an HTTP request's are: the call touches its
// function's flow, and the server's time on its bytes is charged to it,
// by wall time as HTTP's decoding and encoding are (Flow.MeteredSince):
// decoding its message (the codec's, before any interceptor: measured
// there on the same clock and charged once the call is admitted and its
// model found, so that a call its token may not make charges no one),
// laying its tensors out, cutting its answer and encoding it (the codec's
// again, after the handler). The message itself moves in the turns of its
// connection's function, once a large call put the connection in them
// (conns.go).

// bigMessage is the smallest message that puts its connection in its
// function's turns (HTTP's bigAnswer).
const bigMessage = 64 << 10

// inferCall is a ModelInfer call as the codec decodes and encodes it: its
// request, what the server spent on it before its flow was known, and its
// answer, encoded in its flow's name.
type inferCall struct {
	req  pb.ModelInferRequest // first: the refusals' weak key is its address, the call's
	io   inferIO
	resp *pb.ModelInferResponse
	// wire is the message the request's raw inputs lie in (the codec's
	// decodeInfer or splitPieces, which copy them no more): the handler
	// frees it once they are laid out and run.
	wire mem.BufferSlice
	// unencoded gives the call's slot and place back should gRPC-Go
	// drop it before its answer is encoded (inferHandler); the codec
	// stops it.
	unencoded runtime.Cleanup
}

// inferIO is a call's share of the server's I/O: the time its message's
// decoding took, and its function's flow once the handler found it; and
// the slot its inputs were laid out in, where its function's device reads
// them and writes its output (lend: the call may be lent one, its answer
// encoded by the codec, which gives it back).
type inferIO struct {
	decode time.Duration
	fl     *ioshare.Flow
	lend   bool
	land   *lent
	// size is the message's length on the wire (0: not known, the
	// request's proto size), and pieces its raw inputs where the codec
	// left them in its buffers (splitPieces; the request then holds each
	// empty).
	size   int
	pieces [][][]byte
	// peer is the call's, for its answer to find its connection
	// (marshalCall).
	peer *peer.Peer
	// room is its message's in the request bytes held in memory, from
	// once it is read until the handler is done (room.go).
	room room
	// place is the call's place in its token's concurrency, handed over
	// by admit (handOver) for its answer to hold: given back as the
	// answer is encoded, or, where it is held (hold), once gRPC-Go frees
	// it or its connection closes.
	place *place
}

// takePlace is io's place, for an answer held to give back; io keeps
// none.
func (io *inferIO) takePlace() *place {
	p := io.place
	io.place = nil
	return p
}

// raw is req's raw inputs: in the pieces the codec left them in, or as
// proto decoded them.
func (io *inferIO) raw(req *pb.ModelInferRequest) rawInputs {
	return rawInputs{whole: req.GetRawInputContents(), pieces: io.pieces}
}

// lent is a slot lent to a call (Runner.Land), given back once: by the
// codec once the answer cut from it is encoded, by the handler where the
// call failed, or, where a run panicked and the worker may still write
// into it, discarded.
type lent struct {
	call.Landing
	done atomic.Bool
}

func (l *lent) release() { l.releaseFirst() }

// releaseFirst is release, saying whether this was the call that gave the
// slot back.
func (l *lent) releaseFirst() bool {
	if l != nil && l.done.CompareAndSwap(false, true) {
		l.Release()
		return true
	}
	return false
}

func (l *lent) discard() {
	if l != nil && l.done.CompareAndSwap(false, true) {
		l.Discard()
	}
}

// place is a call's place in its token's concurrency (the tap's ticket),
// given back once by whichever of its holders gives it back first: the
// call's end where it has no answer, else its answer's encoding, or,
// where the answer is held, its release (heldSlot.collected: written,
// freed, or dropped and collected) or its connection's close. A place of
// its own, not a field of the call's pending: what a held answer's
// cleanup keeps must not reach its stream, whose transport holds the
// answer's buffers (hold).
type place struct {
	tk   gate.Ticket
	back atomic.Bool
}

func (p *place) giveBack() {
	if p != nil && p.back.CompareAndSwap(false, true) {
		p.tk.Done()
	}
}

// unencodedCall is what a call gRPC-Go dropped unencoded gives back, once
// collected: its slot and its place.
type unencodedCall struct {
	land  *lent
	place *place
}

func (d unencodedCall) giveBack() {
	d.land.release()
	d.place.giveBack()
}

// service is the generated service with ModelInfer's handler inferHandler:
// the generated one decodes into a bare request, with nowhere to keep its
// decoding's time, and answers a bare response, with no flow to charge
// its encoding to.
func (s *Server) service() *grpc.ServiceDesc {
	d := pb.GRPCInferenceService_ServiceDesc
	d.Methods = slices.Clone(d.Methods)
	for i := range d.Methods {
		if d.Methods[i].MethodName == "ModelInfer" {
			d.Methods[i].Handler = inferHandler
		}
	}
	return &d
}

// inferHandler is the generated ModelInfer handler over an inferCall: its
// answer goes back to gRPC-Go as the call, for the codec to encode in its
// flow's name.
func inferHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	s := srv.(*Server)
	c := &inferCall{io: inferIO{lend: true}}
	encoded := false
	defer func() {
		if !encoded { // else the codec's (marshalCall)
			c.io.place.giveBack()
		}
	}()
	defer c.inputsDone()
	defer func() {
		if c.io.fl == nil { // refused before it named a function it may run
			if p, ok := peer.FromContext(ctx); ok {
				s.conns.called(p.LocalAddr, p.Addr, nil, false)
			}
		}
	}()
	if err := c.io.room.await(ctx, s.opts.BodyBudget); err != nil { // before its message is read (room.go)
		st, msg := s.door.FailUnnamed(err, "grpc", "ModelInfer", authorization(ctx))
		return nil, grpcStatus(st, msg, err)
	}
	if err := dec(c); err != nil {
		return nil, err
	}
	h := func(ctx context.Context, req any) (any, error) {
		// Admitted: the call's place goes with it from here, for its
		// answer to hold.
		c.io.place = handOver(ctx)
		return s.modelInfer(ctx, req.(*pb.ModelInferRequest), &c.io)
	}
	var resp any
	var err error
	if interceptor == nil {
		resp, err = h(ctx, &c.req)
	} else {
		resp, err = interceptor(ctx, &c.req, &s.inferInfo, h)
	}
	if r, ok := resp.(*pb.ModelInferResponse); ok && err == nil && (c.io.fl != nil || c.io.land != nil) {
		// gRPC-Go keeps the reply until it is written: the request, whose
		// tensors may be as large as the answer's, need not stay with it.
		proto.Reset(&c.req)
		c.resp = r
		if c.io.land != nil || c.io.place != nil {
			// The codec gives the slot and the place back once it encoded
			// the answer (or once an answer it holds is freed); should
			// gRPC-Go ever drop a reply unencoded, the call's collection
			// does.
			c.unencoded = runtime.AddCleanup(c, unencodedCall.giveBack, unencodedCall{c.io.land, c.io.place})
		}
		encoded = true
		return c, nil
	}
	c.io.land.release()
	return resp, err
}

// inputsDone frees the message the request's raw inputs lay in, and its
// room in the budget: the run has them (in its slot, or copied) or failed.
func (c *inferCall) inputsDone() {
	c.req.RawInputContents, c.io.pieces = nil, nil
	c.wire.Free()
	c.wire = nil
	c.io.room.release()
}

// unmarshalCall decodes a ModelInfer call's message, measuring it: its
// raw inputs are left where they lie in the message, which the call keeps
// until its handler is done: in its buffers where it came in several
// (splitPieces), else in its one (decodeInfer). A second message, which
// gRPC decodes to refuse the call, is copied.
func (c codec) unmarshalCall(data mem.BufferSlice, call *inferCall) error {
	w := ioshare.Now()
	defer func() { call.io.decode = w.Elapsed() }()
	first := call.wire == nil
	call.io.size = data.Len()
	if first && len(data) > 1 {
		if head, raw, ok := splitPieces(data); ok {
			if c.decodeInfer(head, &call.req, false) && raw != nil {
				data.Ref()
				call.wire, call.io.pieces = data, raw
			}
			return nil
		}
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	if c.decodeInfer(buf.ReadOnlyData(), &call.req, first) && first && call.req.RawInputContents != nil {
		call.wire = mem.BufferSlice{buf}
	} else {
		buf.Free()
	}
	return nil
}

// marshalCall encodes a ModelInfer call's answer, metered as its flow's.
// Its raw outputs, cut from the slot its function ran in, are written from
// there (slotOutputs) where the server follows the call's connection, so
// that it can close it should the answer hold the slot too long; else they
// are copied as they are encoded, and the slot given back at once, and an
// answer of bigMessage or more is bounded the same way (heldCopy). An
// answer bounded so holds its call's place in its token's concurrency
// until it is given back or its connection closes, as a large HTTP answer
// holds it until written: else a token of concurrency 1 could have any
// number of them held for clients that do not read. gRPC-Go frees an
// answer's buffers before it writes its call's status (its loopy writer
// frees each as it is written, and writes the trailers only once the
// message's last byte is out), so a client calling one at a time finds
// the place free.
func (c codec) marshalCall(call *inferCall) (mem.BufferSlice, error) {
	t := ioshare.Now()
	defer call.io.fl.MeteredSince(t)
	land := call.io.land
	call.unencoded.Stop()
	// The slot and the place are given back here, a panic's included
	// (recoveringCodec recovers it), unless an answer held took them over
	// (slotOutputs the slot; hold the place, which io then has not).
	handed := false
	defer func() {
		if !handed {
			land.release()
		}
		call.io.place.giveBack()
	}()
	resp := call.resp
	raw := resp.RawOutputContents
	if land == nil || call.io.peer == nil || !slices.ContainsFunc(raw, func(b []byte) bool { return len(b) >= slotOutput }) {
		return c.copied(resp, call.io.peer, &call.io)
	}
	conn := c.s.conns.find(call.io.peer.LocalAddr, call.io.peer.Addr)
	if conn == nil {
		return c.copied(resp, nil, &call.io)
	}
	resp.RawOutputContents = nil
	head, err := c.base.Marshal(resp)
	resp.RawOutputContents = raw
	if err != nil {
		return nil, err
	}
	handed = true
	return c.slotOutputs(head, raw, land, conn, resp.GetModelName(), call.io.takePlace()), nil
}

// copied is resp encoded whole in gRPC-Go's buffers, bounded by the write
// timeout, and holding io's place, where it is large and the server
// follows its connection (p's).
func (c codec) copied(resp *pb.ModelInferResponse, p *peer.Peer, io *inferIO) (mem.BufferSlice, error) {
	msg, err := c.base.Marshal(resp)
	if err != nil || p == nil || msg.Len() < bigMessage {
		return msg, err
	}
	conn := c.s.conns.find(p.LocalAddr, p.Addr)
	if conn == nil {
		return msg, nil
	}
	return c.heldCopy(msg, conn, resp.GetModelName(), io.takePlace()), nil
}

// slotOutput is the smallest raw output written from its slot: a smaller
// one is copied, which costs less than the buffer that would hold it.
const slotOutput = 4 << 10

// slotOutputs is msg, a ModelInferResponse's other fields encoded, with
// its raw_output_contents (field 6) after them (a message's fields may
// come in any order), each past slotOutput a buffer over the slot it lies
// in. The slot is given back once gRPC-Go frees the last of them (or,
// should it drop them unfreed, once they are collected). gRPC-Go has no
// write timeout, and a client that reads slowly or not at all holds them,
// and so the slot and its function's version: past the server's write
// timeout (HTTP's, for an answer written from its slot) the connection is
// closed, as HTTP's would be, and gRPC-Go frees what it held. pl, the
// call's place, is given back with the slot.
func (c codec) slotOutputs(msg mem.BufferSlice, raw [][]byte, land *lent, conn *turnConn, model string, pl *place) mem.BufferSlice {
	refs := c.hold(land, pl, conn, model)
	defer refs.Put(nil)
	var small []byte
	for _, b := range raw {
		small = protowire.AppendTag(small, 6, protowire.BytesType)
		small = protowire.AppendVarint(small, uint64(len(b)))
		if len(b) < slotOutput || mem.IsBelowBufferPoolingThreshold(len(b)) {
			small = append(small, b...)
			continue
		}
		msg = append(msg, mem.SliceBuffer(small))
		small = nil
		msg = append(msg, refs.over(b))
	}
	if len(small) > 0 {
		msg = append(msg, mem.SliceBuffer(small))
	}
	return msg
}

// heldCopy is msg, an answer encoded whole, in buffers that give it back
// to gRPC-Go's pool once it has written them, bounded as an answer written
// from its slot is: a client that does not read a large answer holds it
// in the server's memory otherwise for as long as it keeps its
// connection. pl, the call's place, is given back with the copy.
func (c codec) heldCopy(msg mem.BufferSlice, conn *turnConn, model string, pl *place) mem.BufferSlice {
	refs := c.hold(&lent{Landing: pooled{msg}}, pl, conn, model)
	defer refs.Put(nil)
	out := make(mem.BufferSlice, 0, len(msg))
	for _, b := range msg {
		data := b.ReadOnlyData()
		if mem.IsBelowBufferPoolingThreshold(len(data)) {
			// Not over msg, which goes back to its pool with the last.
			out = append(out, mem.SliceBuffer(slices.Clone(data)))
			continue
		}
		out = append(out, refs.over(data))
	}
	return out
}

// pooled is an answer's encoding in gRPC-Go's buffers, lent to it as a
// slot is (heldCopy), and given back to their pool.
type pooled struct{ msg mem.BufferSlice }

func (p pooled) Input() []byte  { return nil }
func (p pooled) Output() []byte { return nil }
func (p pooled) Release()       { p.msg.Free() }
func (p pooled) Discard()       { p.msg.Free() }

// hold is the pool of the buffers of an answer of model's over land on
// conn, holding one reference (its caller's, to Put once the buffers are
// made): land and pl (its call's place) are given back once the last is
// freed, or once they are collected should gRPC-Go drop them unfreed,
// and pl at the latest as conn closes; past the write timeout answerHeld
// closes conn.
func (c codec) hold(land *lent, pl *place, conn *turnConn, model string) *slotRefs {
	conn.answers.Add(1)
	conn.holdPlace(pl)
	s := c.s // not refs: the timer must not keep them from collection
	back := heldSlot{land, pl, time.AfterFunc(s.opts.WriteTimeout, func() { s.answerHeld(conn, model, land) }), conn}
	refs := &slotRefs{back: back}
	refs.n.Store(1)
	refs.unfreed = runtime.AddCleanup(refs, heldSlot.collected, back)
	return refs
}

// answerHeld has heldSlots judge an answer of model's on conn still
// holding land (its slot, or its copy in gRPC-Go's pool) at its write
// timeout: after a collection, one still held closes its connection.
func (s *Server) answerHeld(conn *turnConn, model string, land *lent) {
	if !land.done.Load() { // else freed as the timer fired
		s.held.suspect(conn, model, land)
	}
}

// heldSlot gives back once what an answer holds, its slot or its copy,
// and its call's place (slotRefs.Put, or its cleanup where gRPC-Go dropped
// its buffers unfreed), stopping the write timer, which must not close a
// connection whose answer is back: one that drops a frame queued as its
// client reset the stream stays up. It holds no slotRefs, which the
// cleanup must not reach.
type heldSlot struct {
	land  *lent
	place *place
	held  *time.Timer
	conn  *turnConn
}

func (h heldSlot) collected() {
	if h.land.releaseFirst() { // first: a timer firing now finds it back
		h.conn.answers.Add(-1)
	}
	h.conn.letPlace(h.place)
	h.held.Stop()
}

// slotRefs is the pool of the buffers over one call's slot: the slot is
// given back when the last is freed.
type slotRefs struct {
	back    heldSlot
	n       atomic.Int32
	unfreed runtime.Cleanup
}

// over is a buffer over b, at least gRPC-Go's pooling threshold long (a
// buffer it would not pool would never reach Put), counted in r.
func (r *slotRefs) over(b []byte) mem.Buffer {
	r.n.Add(1)
	whole := b[:len(b):len(b)]
	return mem.NewBuffer(&whole, r)
}

func (r *slotRefs) Get(int) *[]byte { panic("grpcapi: a slot's buffers are not for reuse") }

func (r *slotRefs) Put(*[]byte) {
	if r.n.Add(-1) == 0 {
		r.unfreed.Stop()
		r.back.collected()
	}
}

// wireMessage is the message v is on the wire: an inferCall's request or
// answer.
func wireMessage(v any) any {
	if c, ok := v.(*inferCall); ok {
		if c.resp != nil {
			return c.resp
		}
		return &c.req
	}
	return v
}
