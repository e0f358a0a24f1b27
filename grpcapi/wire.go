package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unicode/utf8"
	"weak"

	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/errdefs"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/oip"
)

// A ModelInferRequest decodes to far more memory than its message holds
// where it is made of many small parts: an empty input is two bytes on the
// wire and about 150 in memory (a 4 MiB message of them took 308 MiB), an
// INT64 zero one byte and eight. gRPC decodes a message whole before any
// handler runs, so the server's codec reads an inference request's wire
// bytes first and decodes it only when what it would become is bounded:
// at most oip.MaxParts tensors, parameters and bytes elements, and its
// shapes and typed contents at most the message limit once widened (a
// tensor that large could not be sent raw either). A request over either
// is decoded no further than its names, for the refusal to name them; the
// refusal waits in the server for the call's interceptor, since gRPC
// answers a codec's own error as the server's fault (Internal).
// codec is the proto codec with that check before a ModelInferRequest.
type codec struct {
	s    *Server
	base encoding.CodecV2
}

func newCodec(s *Server) codec {
	return codec{s: s, base: encoding.GetCodecV2(protocodec.Name)}
}

func (c codec) Name() string { return protocodec.Name }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if call, ok := v.(*inferCall); ok {
		return c.marshalCall(call)
	}
	return c.base.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	switch m := v.(type) {
	case *inferCall:
		return c.unmarshalCall(data, m)
	case *pb.ModelInferRequest:
		return c.unmarshalInfer(data, m)
	case *pb.ModelReadyRequest:
		return unmarshalOrRefuse(c, data, m, "ModelReadyRequest")
	case *pb.ModelMetadataRequest:
		return unmarshalOrRefuse(c, data, m, "ModelMetadataRequest")
	}
	return c.base.Unmarshal(data, v)
}

// unmarshalOrRefuse decodes a request message, or leaves its refusal
// (InvalidArgument naming the message and what is wrong) for its handler:
// an error here is gRPC-Go's Internal, a server's fault, for a client's
// malformed bytes.
func unmarshalOrRefuse[T any, P interface {
	*T
	proto.Message
}](c codec, data mem.BufferSlice, m P, what string) error {
	if err := c.base.Unmarshal(data, m); err != nil {
		proto.Reset(m)
		putRefusal(&c.s.refused, (*T)(m), badRequest("the request message is not a valid %s: %v", what, err))
	}
	return nil
}

// unmarshalInfer decodes a ModelInferRequest within the bounds above, its
// bytes copied out of data.
func (c codec) unmarshalInfer(data mem.BufferSlice, req *pb.ModelInferRequest) error {
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	c.decodeInfer(buf.ReadOnlyData(), req, false)
	return nil
}

// decodeInfer decodes b into req within the bounds above (true), or
// leaves the refusal for the call's interceptor. Where alias, req's raw
// input contents are b's own bytes, not copies: b must then outlive them
// (unmarshalCall).
func (c codec) decodeInfer(b []byte, req *pb.ModelInferRequest, alias bool) bool {
	err := checkInferWire(b, int64(c.s.opts.MaxMessageBytes))
	if err == nil {
		head, raw := b, [][]byte(nil)
		if alias {
			head, raw = splitRaw(b)
		}
		if err = proto.Unmarshal(head, req); err == nil {
			if raw != nil {
				req.RawInputContents = raw
			}
			return true
		}
		// What the walk does not look into (a parameter's entry, a
		// string's UTF-8) is still the client's fault.
		err = badRequest("model %s: the request message is not a valid ModelInferRequest: %v", headName(b), err)
		proto.Reset(req)
	}
	decodeHead(b, req)
	putRefusal(&c.s.refused, req, err)
	return false
}

// splitRaw parts a ModelInferRequest's wire bytes, which checkInferWire
// walked, into its raw_input_contents (field 7), as they lie in b, and
// the rest, for proto to decode: its inputs' bytes, up to the message's
// whole size, are then neither copied nor allocated once more, but
// copied straight to where the function reads them.
func splitRaw(b []byte) (head []byte, raw [][]byte) {
	rest := b
	for len(rest) > 0 {
		num, typ, n := protowire.ConsumeTag(rest)
		m := protowire.ConsumeFieldValue(num, typ, rest[n:])
		if n < 0 || m < 0 { // checked: not so
			return b, nil
		}
		if num == 7 && typ == protowire.BytesType {
			v, _ := protowire.ConsumeBytes(rest[n:])
			raw = append(raw, v[:len(v):len(v)])
			if head == nil { // the fields before the first raw one
				head = make([]byte, 0, min(len(b)-len(rest), 4<<10)+64)
				head = append(head, b[:len(b)-len(rest)]...)
			}
		} else if head != nil {
			head = append(head, rest[:n+m]...)
		}
		rest = rest[n+m:]
	}
	if raw == nil {
		return b, nil
	}
	return head, raw
}

// refusals holds what the codec refused, by the request it left half
// decoded, until the call's interceptor takes it (takeRefusal). A call
// may end between the two (a second message, a reset, the read timeout),
// its interceptor never run: the request is held weakly, and its entry
// goes when the request does.
type refusals struct {
	n atomic.Int64 // entries: a call looks only while there are some
	m sync.Map     // weak.Pointer[T] of a request message -> error
}

// putRefusal notes err as the codec's refusal of req.
func putRefusal[T any](r *refusals, req *T, err error) {
	k := weak.Make(req)
	// gRPC decodes a unary call's second message into its first's
	// request (to refuse the call): one entry, one cleanup.
	if _, again := r.m.Swap(k, err); !again {
		r.n.Add(1)
		runtime.AddCleanup(req, r.drop, any(k))
	}
}

// takeRefusalOf removes req's refusal and returns it, or nil.
func takeRefusalOf[T any](r *refusals, req *T) error {
	if r.n.Load() == 0 {
		return nil
	}
	if err, ok := r.m.LoadAndDelete(weak.Make(req)); ok {
		r.n.Add(-1)
		return err.(error)
	}
	return nil
}

func (r *refusals) drop(k any) {
	if _, ok := r.m.LoadAndDelete(k); ok {
		r.n.Add(-1)
	}
}

type refusedKey struct{}

// takeRefusal moves req's refusal, if the codec left one, into the
// call's context for the handler to answer with.
func (s *Server) takeRefusal(ctx context.Context, req any) context.Context {
	var err error
	switch r := req.(type) {
	case *pb.ModelInferRequest:
		err = takeRefusalOf(&s.refused, r)
	case *pb.ModelReadyRequest:
		err = takeRefusalOf(&s.refused, r)
	case *pb.ModelMetadataRequest:
		err = takeRefusalOf(&s.refused, r)
	}
	if err != nil {
		return context.WithValue(ctx, refusedKey{}, err)
	}
	return ctx
}

// refusal is the codec's refusal of the call's request, or nil.
func refusal(ctx context.Context) error {
	err, _ := ctx.Value(refusedKey{}).(error)
	return err
}

// decodeHead decodes the request's model name, version and id alone, each
// of at most maxHead bytes (a longer one names no function: left empty).
func decodeHead(b []byte, req *pb.ModelInferRequest) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return
		}
		b = b[n:]
		if typ == protowire.BytesType && num >= 1 && num <= 3 {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return
			}
			if len(v) <= maxHead && utf8.Valid(v) {
				s := string(v) // copied: the buffer goes back to its pool
				switch num {
				case 1:
					req.ModelName = s
				case 2:
					req.ModelVersion = s
				case 3:
					req.Id = s
				}
			}
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return
		}
		b = b[m:]
	}
}

const maxHead = 256

// wireCount is what a message's parts would decode to.
type wireCount struct {
	objects int   // tensors, parameters, bytes elements: an allocation each
	widened int64 // shapes' and typed contents' bytes in memory
}

// checkInferWire is the codec's check of a ModelInferRequest's wire bytes:
// nil where it decodes within the bounds above.
func checkInferWire(b []byte, limit int64) error {
	var c wireCount
	err := fields(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		switch num {
		case 4, 6, 7: // parameters, outputs (their parameters too), raw_input_contents
			if num == 6 && typ == protowire.BytesType {
				if err := fields(v, func(num protowire.Number, _ protowire.Type, _ []byte) error {
					if num == 2 {
						return c.part()
					}
					return nil
				}); err != nil {
					return err
				}
			}
			return c.part()
		case 5: // an input
			if typ == protowire.BytesType {
				if err := c.input(v); err != nil {
					return err
				}
			}
			return c.part()
		}
		return nil
	})
	switch {
	case err == errParts:
		return badRequest("model %s: the request message holds more than %d tensors, parameters and bytes_contents elements", headName(b), oip.MaxParts)
	case err != nil: // the decoder would stop there too, past what came before
		return badRequest("model %s: the request message is not a valid ModelInferRequest: %v", headName(b), err)
	case c.widened > limit:
		return &apierr.Error{Status: apierr.TooLarge, Msg: fmt.Sprintf(
			"model %s: the request's shapes and typed contents come to %d bytes in memory, over the server's limit of %d bytes (plover serve --max-body): send the inputs as raw_input_contents", headName(b), c.widened, limit)}
	}
	return nil
}

// errParts stops the count past oip.MaxParts.
var errParts = errors.New("too many parts")

// part counts an allocation.
func (c *wireCount) part() error {
	if c.objects++; c.objects > oip.MaxParts {
		return errParts
	}
	return nil
}

// input counts an InferInputTensor's parts.
func (c *wireCount) input(b []byte) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		switch num {
		case 3: // shape: int64 varints
			c.widened += 8 * elements(typ, v, 0)
		case 4: // a parameter
			return c.part()
		case 5: // contents
			if typ == protowire.BytesType {
				return c.contents(v)
			}
		}
		return nil
	})
}

// contentWidth is an element's size in memory for each field of
// InferTensorContents (bool, int32, int64, uint32, uint64, float,
// double), and its fixed size on the wire where it has one.
var contentWidth = [8]struct{ mem, wire int }{1: {1, 0}, 2: {4, 0}, 3: {8, 0}, 4: {4, 0}, 5: {8, 0}, 6: {4, 4}, 7: {8, 8}}

// contents counts an InferTensorContents' elements.
func (c *wireCount) contents(b []byte) error {
	return fields(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		switch {
		case num == 8: // a bytes element: a slice header and its bytes
			c.widened += 24 + int64(len(v))
			return c.part()
		case num >= 1 && num < 8:
			w := contentWidth[num]
			c.widened += int64(w.mem) * elements(typ, v, w.wire)
		}
		return nil
	})
}

// elements is how many elements one occurrence of a repeated scalar field
// holds: one unpacked, or those its packed bytes hold (fixed of wire bytes
// each; 0: varints).
func elements(typ protowire.Type, v []byte, fixed int) int64 {
	if typ != protowire.BytesType {
		return 1
	}
	if fixed > 0 {
		return int64(len(v) / fixed)
	}
	n := int64(0)
	for _, x := range v {
		if x < 0x80 { // a varint's last byte
			n++
		}
	}
	return n
}

// fields calls f for each field of a message's wire bytes with its value's
// bytes (a length-delimited field's contents); a malformed message is an
// error.
func fields(b []byte, f func(protowire.Number, protowire.Type, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return protowire.ParseError(m)
		}
		v := b[:m]
		if typ == protowire.BytesType {
			v, _ = protowire.ConsumeBytes(v)
		}
		if err := f(num, typ, v); err != nil {
			return err
		}
		b = b[m:]
	}
	return nil
}

// headName is the request's model name for a refusal, quoted, its first
// 64 bytes at most.
func headName(b []byte) string {
	var r pb.ModelInferRequest
	decodeHead(b, &r)
	return errdefs.QuoteName(r.GetModelName())
}
