package httpapi

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/call"
	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/ioshare"
	"github.com/plover-run/plover/oip"
	"github.com/plover-run/plover/reqmetrics"
)

// invokeBody is the JSON request. Two shapes share it: Plover's
// {"input", "chain", "out_bytes", "tmp_bytes"} and PyPlover's
// {"name", "inputs", "func_names", "grid_sizes", "block_sizes",
// "output_size", "tmp_size"}, whose parallel arrays form the chain.
type invokeBody struct {
	Input     *string      `json:"input"`
	Chain     []abi.Launch `json:"chain"`
	OutBytes  *int64       `json:"out_bytes"`
	TmpBytes  *int64       `json:"tmp_bytes"`
	TimeoutMs *int64       `json:"timeout_ms"`

	Name       *string  `json:"name"`
	Inputs     *string  `json:"inputs"`
	FuncNames  []string `json:"func_names"`
	GridSizes  []int    `json:"grid_sizes"`
	BlockSizes []int    `json:"block_sizes"`
	OutputSize *int64   `json:"output_size"`
	TmpSize    *int64   `json:"tmp_size"`
}

// parseInvoke turns a JSON body into the input bytes and an override (nil
// when the request changes nothing).
func parseInvoke(body []byte, name string) ([]byte, *call.Override, time.Duration, error) {
	in, o, b, err := parseInvokeBody(body, name)
	if err != nil || b.TimeoutMs == nil {
		return in, o, 0, err
	}
	if *b.TimeoutMs <= 0 {
		return nil, nil, 0, badField("timeout_ms", "must be a positive number of milliseconds")
	}
	return in, o, timeoutOf(min(uint64(*b.TimeoutMs), maxTimeoutMs)), nil
}

func parseInvokeBody(body []byte, name string) ([]byte, *call.Override, *invokeBody, error) {
	// encoding/json decodes what it is given, and a launch of a chain is
	// 32 bytes in memory for 3 sent ("{},"): a body within its bound
	// (twice max_input_bytes) could take ten times it.
	if tooManyValues(body) {
		return nil, nil, nil, badField("body", fmt.Sprintf("holds more than %d JSON values (a chain has at most %d launches)", oip.MaxParts, abi.MaxChainLength))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var b invokeBody
	if err := dec.Decode(&b); err != nil {
		return nil, nil, nil, badField("body", bodyReason(err))
	}
	// Whitespace alone may follow, as in /v2's header: More takes a
	// closing bracket for the end, and ran a body like {"input":...}]]}.
	if rest := body[dec.InputOffset():]; len(bytes.TrimLeft(rest, " \t\r\n")) > 0 {
		return nil, nil, nil, badField("body", fmt.Sprintf("trailing data after the JSON object (%d bytes)", len(rest)))
	}
	pyplover := b.Inputs != nil || b.FuncNames != nil || b.GridSizes != nil || b.BlockSizes != nil || b.OutputSize != nil || b.TmpSize != nil || b.Name != nil
	native := b.Input != nil || b.Chain != nil || b.OutBytes != nil || b.TmpBytes != nil
	if pyplover && native {
		return nil, nil, nil, badField("body", `mixes Plover fields (input, chain, out_bytes, tmp_bytes) with PyPlover fields (name, inputs, func_names, grid_sizes, block_sizes, output_size, tmp_size); use one shape`)
	}
	o := &call.Override{OutBytes: -1, TmpBytes: -1}
	field := "input"
	enc := b.Input
	if pyplover {
		field, enc = "inputs", b.Inputs
		if b.Name != nil && *b.Name != name {
			return nil, nil, nil, badField("name", fmt.Sprintf("%s does not match the function in the URL, %q", errdefs.QuoteName(*b.Name), name))
		}
		chain, err := pyChain(b.FuncNames, b.GridSizes, b.BlockSizes)
		if err != nil {
			return nil, nil, nil, err
		}
		o.Chain, o.Names = chain, pyName
		b.OutBytes, b.TmpBytes = b.OutputSize, b.TmpSize
	} else {
		o.Chain = b.Chain
	}
	if enc == nil {
		return nil, nil, nil, badField(field, "is required: the input bytes, base64-encoded")
	}
	input, err := base64.StdEncoding.DecodeString(*enc)
	if err != nil {
		return nil, nil, nil, badField(field, "is not valid base64: "+err.Error())
	}
	for _, f := range []struct {
		name string
		v    *int64
		dst  *int64
	}{{sizeField(pyplover, "out"), b.OutBytes, &o.OutBytes}, {sizeField(pyplover, "tmp"), b.TmpBytes, &o.TmpBytes}} {
		if f.v == nil {
			continue
		}
		if *f.v < 0 {
			return nil, nil, nil, badField(f.name, "must not be negative")
		}
		*f.dst = *f.v
	}
	if o.Chain == nil && o.OutBytes < 0 && o.TmpBytes < 0 {
		o = nil
	}
	return input, o, &b, nil
}

func sizeField(pyplover bool, which string) string {
	if pyplover {
		return pyName(which + "_bytes")
	}
	return which + "_bytes"
}

// pyName is a PyPlover body's name for an override's field, given its
// Plover name (call.Override.Names): chain[1].grid is grid_sizes[1].
func pyName(field string) string {
	switch field {
	case "out_bytes":
		return "output_size"
	case "tmp_bytes":
		return "tmp_size"
	case "chain":
		return "func_names"
	}
	var i int
	var sub string
	if n, _ := fmt.Sscanf(field, "chain[%d].%s", &i, &sub); n == 2 {
		if arr, ok := map[string]string{"kernel": "func_names", "grid": "grid_sizes", "block": "block_sizes"}[sub]; ok {
			return fmt.Sprintf("%s[%d]", arr, i)
		}
	}
	return field
}

func pyChain(names []string, grids, blocks []int) ([]abi.Launch, error) {
	if names == nil {
		if grids != nil || blocks != nil {
			return nil, badField("func_names", "is required when grid_sizes or block_sizes is given")
		}
		return nil, nil
	}
	if len(grids) != len(names) {
		return nil, badField("grid_sizes", fmt.Sprintf("has %d entries, func_names has %d", len(grids), len(names)))
	}
	if len(blocks) != len(names) {
		return nil, badField("block_sizes", fmt.Sprintf("has %d entries, func_names has %d", len(blocks), len(names)))
	}
	chain := make([]abi.Launch, len(names))
	for i := range names {
		chain[i] = abi.Launch{Kernel: names[i], Grid: grids[i], Block: blocks[i]}
	}
	return chain, nil
}

// invokeJSON runs a JSON request and, on success, writes its response.
func (s *Server) invokeJSON(ctx *fasthttp.RequestCtx, name call.Name, c *exchange) error {
	limit, err := s.inputLimit(ctx, name, "", base64JSON, c.req.Deadline)
	if err != nil {
		return err
	}
	fn := name.Borrow()
	tn := s.turnsOf(ctx, fn, &c.req)
	body, held, err := s.readBody(ctx, limit, nil, tn)
	if err != nil {
		return err
	}
	defer s.releaseBody(held)
	start := ioshare.Now() // decoding is the server's CPU on the function's bytes too
	input, o, timeout, err := parseInvoke(body, fn)
	tn.fl.MeteredSince(start)
	if err != nil {
		return err
	}
	// timeout_ms is the client's deadline when its header asked for none
	// (in place of the server's default, longer or shorter), and lowers
	// the header's otherwise; counted, as every deadline, from the start.
	if d := c.req.Began.Add(timeout); timeout > 0 && (len(ctx.Request.Header.PeekBytes(hdrTimeout)) == 0 || d.Before(c.req.Deadline)) {
		c.req.Deadline = d
	}
	c.req.Input, c.req.Override = input, o
	err = s.door.Invoke(context.Background(), fn, &c.req) // see invoke
	c.req.Input, c.req.Override = nil, nil
	if err != nil {
		return err
	}
	defer tn.fl.MeteredSince(ioshare.Now()) // and encoding
	t := &c.req.Timing
	out := make([]byte, 0, base64.StdEncoding.EncodedLen(len(c.req.Output))+256)
	out = append(out, `{"output":"`...)
	out = base64.StdEncoding.AppendEncode(out, c.req.Output)
	out = append(out, `","cold":`...)
	out = strconv.AppendBool(out, c.req.Start == call.Cold)
	out = append(out, `,"start":"`...)
	out = append(out, c.req.Start.String()...)
	out = append(out, `","version":`...)
	out = appendJSONString(out, c.req.Version) // JSON's escaping, not Go's
	out = append(out, `,"timing_us":{`...)
	for i, kv := range []struct {
		k string
		v int64
	}{{"queue", t.Queue.Microseconds()}, {"load", t.Load.Microseconds()}, {"copy_in", t.CopyIn.Microseconds()},
		{"kernels", t.Kernels.Microseconds()}, {"copy_out", t.CopyOut.Microseconds()}, {"total", t.Total.Microseconds()}} {
		if i > 0 {
			out = append(out, ',')
		}
		out = strconv.AppendQuote(out, kv.k)
		out = append(out, ':')
		out = strconv.AppendInt(out, kv.v, 10)
	}
	out = append(out, '}')
	// A pipeline: each function step, in the order they ran; one its
	// caller may not learn of by its place and time alone.
	sees := s.stepsSeen(ctx, c, nil)
	for i := range c.req.Steps {
		st := &c.req.Steps[i]
		if i == 0 {
			out = append(out, `,"steps":[`...)
		} else {
			out = append(out, ',')
		}
		out = append(out, `{"step":`...)
		out = strconv.AppendInt(out, int64(st.Index), 10)
		if reqmetrics.StepShown(st, sees) {
			out = append(out, `,"function":`...)
			out = appendJSONString(out, st.Step)
			out = append(out, `,"version":`...)
			out = appendJSONString(out, st.Version)
			out = append(out, `,"start":"`...)
			out = append(out, st.Start.String()...)
			out = append(out, '"')
		}
		out = append(out, `,"total_us":`...)
		out = strconv.AppendInt(out, st.Timing.Total.Microseconds(), 10)
		out = append(out, '}')
		if i == len(c.req.Steps)-1 {
			out = append(out, ']')
		}
	}
	out = append(out, "}\n"...)
	c.req.Output = c.req.Output[:0]
	ctx.SetContentType("application/json")
	ctx.SetBody(out)
	s.writeMeta(ctx, c)
	s.pieceAnswer(ctx, tn)
	return nil
}
