package httpapi

// The control plane's routes: deploy, describe, roll back and remove
// functions, collect unused bundles, the node's health. Each calls the
// Admin (engine.Control) and writes its answer; none is on the hot path.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/apierr"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/pipedef"
)

func (s *Server) function(ctx *fasthttp.RequestCtx, name string) {
	switch string(ctx.Method()) {
	case fasthttp.MethodGet:
		fi, err := s.describe(ctx, name)
		if err != nil {
			s.fail(ctx, err)
			return
		}
		writeJSON(ctx, fasthttp.StatusOK, fi)
	case fasthttp.MethodPut:
		s.deploy(ctx, name)
	case fasthttp.MethodDelete:
		if err := s.adm.Delete(pipedef.WithSees(callCtx(ctx), s.view(ctx).Sees), name, ctx.QueryArgs().GetBool("force")); err != nil {
			s.fail(ctx, err)
			return
		}
		writeJSON(ctx, fasthttp.StatusOK, map[string]string{"deleted": name})
	default:
		writeError(ctx, fasthttp.StatusMethodNotAllowed, "method_not_allowed", string(ctx.Method())+" is not allowed on a function; use GET, PUT or DELETE")
		ctx.Response.Header.Set("Allow", "GET, PUT, DELETE")
	}
}

// functionSub routes /v1/functions/{name}/{sub}; tk is the request's place
// in its token's concurrency, which a followed log stream takes on.
func (s *Server) functionSub(ctx *fasthttp.RequestCtx, name, sub string, tk *gate.Ticket) {
	switch sub {
	case "versions":
		if !s.method(ctx, fasthttp.MethodGet) {
			return
		}
		rec, err := s.versions(ctx, name)
		if err != nil {
			s.fail(ctx, err)
			return
		}
		writeJSON(ctx, fasthttp.StatusOK, rec)
	case "logs":
		if s.method(ctx, fasthttp.MethodGet) {
			s.logs(ctx, name, tk)
		}
	case "rollback":
		if !s.method(ctx, fasthttp.MethodPost) {
			return
		}
		// JSON only, as invoke's JSON: a browser sends text/plain from any
		// site's page without asking the server first.
		if ct := mediaType(ctx.Request.Header.ContentType()); ct != "application/json" {
			writeError(ctx, fasthttp.StatusUnsupportedMediaType, "unsupported_media_type",
				"Content-Type "+strconv.Quote(ct)+`: send application/json ({"version":"<version id or its first 8+ characters>"})`)
			return
		}
		var body struct {
			Version string `json:"version"`
		}
		b, held, err := s.readBody(ctx, bodyLimit{n: 64 << 10, why: "for this route"}, nil, turns{})
		if err != nil {
			s.fail(ctx, err)
			return
		}
		s.releaseBody(held) // parsed below: the bytes are done with
		if err := strictJSON(b, &body); err != nil || body.Version == "" {
			writeError(ctx, fasthttp.StatusBadRequest, "bad_request", `body must be {"version":"<version id or its first 8+ characters>"}`)
			return
		}
		fi, err := s.adm.Rollback(s.invokeCheck(ctx), name, body.Version)
		if err != nil {
			s.fail(ctx, err)
			return
		}
		writeJSON(ctx, fasthttp.StatusOK, fi)
	default:
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "no route for "+string(ctx.Path()))
	}
}

func (s *Server) gc(ctx *fasthttp.RequestCtx) {
	grace := time.Minute
	if g := ctx.QueryArgs().Peek("grace"); len(g) > 0 {
		d, err := time.ParseDuration(string(g))
		if err != nil || d < 0 {
			writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "grace: want a duration such as 30s or 0s")
			return
		}
		grace = d
	}
	removed, err := s.adm.GC(callCtx(ctx), grace)
	if err != nil {
		s.fail(ctx, err)
		return
	}
	if removed == nil {
		removed = []string{}
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"removed": removed})
}

// strictJSON decodes b, one JSON value with no unknown fields and nothing
// but whitespace after it, as /v1 and /v2 bodies are read: a rollback
// body of two objects went to the first one's version.
func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if rest := b[dec.InputOffset():]; len(bytes.TrimLeft(rest, " \t\r\n")) > 0 {
		return fmt.Errorf("trailing data after the JSON value (%d bytes)", len(rest))
	}
	return nil
}

func (s *Server) deploy(ctx *fasthttp.RequestCtx, name string) {
	switch ct := mediaType(ctx.Request.Header.ContentType()); ct {
	case bundle.MediaType, "application/octet-stream", "application/zstd":
	default:
		writeError(ctx, fasthttp.StatusUnsupportedMediaType, "unsupported_media_type",
			"Content-Type "+strconv.Quote(ct)+": a bundle is sent as "+bundle.MediaType+" (plover deploy DIR does this)")
		return
	}
	// The version is the deploying token's (its name, the tenant whose
	// worker runs it under --worker-scope tenant).
	tenant, r := s.gate.Tenant(ctx.Request.Header.PeekBytes(hdrAuthorization))
	if r != nil {
		s.refuse(ctx, r)
		return
	}
	// The bundle streams to a file as it arrives (Deploy spools it), so it
	// takes no room in the body budget.
	var body io.Reader
	over := func(size string) error {
		return tooLarge("bundle of " + size + " bytes is over the limit of " + strconv.Itoa(s.opts.MaxBodyBytes) + " bytes (plover serve --max-body)")
	}
	if cl := ctx.Request.Header.ContentLength(); cl > s.opts.MaxBodyBytes {
		s.fail(ctx, over(strconv.Itoa(cl)))
		return
	}
	if stream := ctx.RequestBodyStream(); stream != nil {
		// Marked read only when the stream itself ends; past the limit the
		// read fails with the 413 (the engine's error wraps it), never a
		// bundle cut short and refused as damaged.
		body = &bundleReader{s: s, r: stream, ctx: ctx, left: int64(s.opts.MaxBodyBytes),
			over: over("more than " + strconv.Itoa(s.opts.MaxBodyBytes)), length: int64(ctx.Request.Header.ContentLength()),
			name: name, tenant: tenant}
	} else {
		body = bytes.NewReader(ctx.Request.Body())
	}
	fi, err := s.adm.DeployAs(s.invokeCheck(ctx), name, tenant, body, ctx.QueryArgs().GetBool("force"))
	if err != nil {
		s.fail(ctx, err)
		return
	}
	status := fasthttp.StatusCreated
	if fi.Unchanged {
		status = fasthttp.StatusOK // nothing was created
	}
	writeJSON(ctx, status, fi)
}

// bundleReader reads a deploy's streamed body. It marks the body read
// once the stream ends; fails past the limit with the 413; tells a body
// that ends short of its Content-Length, a stall and a client gone as
// such (400, 408, 499), not as a damaged bundle or a bad request; and
// gives the connection the server's read timeout anew as bytes arrive
// (at most once a second, or a quarter of the timeout): an upload is bounded between its bytes, not in
// all, so that a large bundle over a slow link is not cut off while it
// moves (plover deploy watches it the same way).
type bundleReader struct {
	s       *Server
	r       io.Reader
	ctx     *fasthttp.RequestCtx
	left    int64 // bytes the body may still have; past them, over
	over    error
	length  int64 // its Content-Length; < 0 where it has none (chunked)
	got     int64
	renewed time.Time
	// The function deployed and the tenant the deploy was admitted as,
	// asked again as the upload ends (stillAllowed).
	name, tenant string
}

func (m *bundleReader) Read(p []byte) (int, error) {
	n, err := m.r.Read(p)
	m.got += int64(n)
	if m.left -= int64(n); m.left < 0 {
		return n, m.over
	}
	if n > 0 {
		// Renewed well before it would pass: a read a second after the last
		// renewal would come too late for a read timeout of a second.
		if now := time.Now(); now.Sub(m.renewed) >= min(time.Second, m.s.readTimeout()/4) {
			m.renewed = now
			m.ctx.Conn().SetReadDeadline(now.Add(m.s.readTimeout()))
		}
	}
	switch {
	case err == nil:
	case (err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF)) && m.length >= 0 && m.got < m.length:
		return n, &apierr.Error{Status: apierr.BadRequest,
			Msg: "the bundle ended after " + strconv.FormatInt(m.got, 10) + " of its " + strconv.FormatInt(m.length, 10) + " bytes (Content-Length): send it whole"}
	case err == io.EOF:
		markRead(m.ctx)
		if refused := m.stillAllowed(); refused != nil {
			return n, refused
		}
	case timedOut(err):
		return n, &apierr.Error{Status: apierr.RequestTimeout,
			Msg: "the bundle's upload stalled: no byte of it arrived for the server's read timeout of " + m.s.readTimeout().String() + " (after " + strconv.FormatInt(m.got, 10) + " bytes)"}
	default:
		return n, m.s.bodyError(err, m.s.serverLimit())
	}
	return n, err
}

// stillAllowed asks again, as a streamed upload ends, whether its token
// may deploy the function, as the same tenant: an upload may take as
// long as its client keeps sending, and a token revoked or narrowed by a
// reload meanwhile (its holder's leaked token, say) must not land its
// code afterwards. What remains is the unpacking and the store's write,
// which the upload's end starts.
func (m *bundleReader) stillAllowed() error {
	authorization := m.ctx.Request.Header.PeekBytes(hdrAuthorization)
	r := m.s.gate.Check(authorization, auth.Deploy, m.name)
	if r == nil {
		if tenant, rt := m.s.gate.Tenant(authorization); rt != nil {
			r = rt
		} else if tenant != m.tenant {
			return &apierr.Error{Status: apierr.Forbidden,
				Msg: "the token's name in the auth file changed from " + m.tenant + " to " + tenant + " while the bundle was uploaded (a reload): deploy it again"}
		}
	}
	if r != nil {
		return &apierr.Error{Status: r.Status, Msg: r.Msg + " (asked again as the bundle's upload ended: the auth file was reloaded meanwhile)"}
	}
	return nil
}

func (s *Server) list(ctx *fasthttp.RequestCtx) {
	fs, err := s.functions(ctx)
	if err != nil {
		s.fail(ctx, err)
		return
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"functions": fs})
}

func (s *Server) health(ctx *fasthttp.RequestCtx) {
	ok, devs := s.door.Health()
	status, code := "ok", fasthttp.StatusOK
	if !ok {
		status, code = "unhealthy", fasthttp.StatusServiceUnavailable
	}
	if !s.gate.Reads(ctx.Request.Header.PeekBytes(hdrAuthorization)) {
		// A probe without a token of the read scope: each device's name
		// and health, not its memory nor its error, which follow other
		// tenants' loads and cold starts (a review's probe).
		type probed struct {
			Name    string `json:"name"`
			Target  string `json:"target"`
			Healthy bool   `json:"healthy"`
		}
		shown := make([]probed, len(devs))
		for i, d := range devs {
			shown[i] = probed{d.Name, d.Target, d.Healthy}
		}
		writeJSON(ctx, code, map[string]any{"status": status, "devices": shown})
		return
	}
	body := map[string]any{"status": status, "devices": devs}
	if s.opts.CPUWeights != nil {
		mech, why := s.opts.CPUWeights()
		body["cpu_weights"] = mech
		if why != "" {
			body["cpu_weights_off"] = why
		}
	}
	writeJSON(ctx, code, body)
}
