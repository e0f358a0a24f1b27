package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/gate"
)

// LogReader serves what functions print (engine.Control): GET
// /v1/functions/{name}/logs. An Admin without it answers that route 404.
type LogReader interface {
	Logs(ctx context.Context, name string, since time.Time, follow bool) ([]api.LogLine, *funclog.Follower, error)
}

// followWrite bounds each write of a followed stream (the server's
// WriteTimeout bounds only the response's start), and followPoll is how
// often an idle one checks that its client is still there and the server
// is not going down.
// A stream quiet for followKeepAlive gets an empty line: a client that went
// away without a trace (its machine gone, no FIN) shows up as a failed
// write, and proxies see traffic.
// (Variables for the tests, which shorten them.)
var (
	followWrite     = 30 * time.Second
	followPoll      = time.Second
	followKeepAlive = 15 * time.Second
)

// logs answers GET /v1/functions/{name}/logs (scope read): the function's
// kept output as NDJSON, one api.LogLine a line, from ?since= (a duration
// back from now, or an RFC 3339 time) on; with ?follow=true the response
// stays open and carries each new line as it comes, until the client goes,
// the function is deleted, the server shuts down or the request's token no
// longer reads the function (an auth-file reload). The stream holds a
// place among its token's (without tokens, its client's) followed streams
// (gate.Follow) until it ends:
// the request's own place in its token's concurrency (tk) is given back as
// the handler returns, before the stream is written.
func (s *Server) logs(ctx *fasthttp.RequestCtx, name string, tk *gate.Ticket) {
	lr, ok := s.adm.(LogReader)
	if !ok {
		writeError(ctx, fasthttp.StatusNotFound, "not_found", "this server keeps no function output")
		return
	}
	args := ctx.QueryArgs()
	var since time.Time
	if v := string(args.Peek("since")); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d >= 0 {
			since = time.Now().Add(-d)
		} else if since, err = time.Parse(time.RFC3339Nano, v); err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "since: want a duration back from now (30s, 5m, 2h) or an RFC 3339 time, not "+v)
			return
		}
	}
	follow := false
	switch v := string(args.Peek("follow")); v {
	case "", "false", "0":
	case "true", "1":
		follow = true
	default:
		writeError(ctx, fasthttp.StatusBadRequest, "bad_request", "follow: want true or false, not "+v)
		return
	}
	// Taken before the follower (funclog's places), and given back if
	// there is none.
	var held gate.Ticket
	if follow {
		var r *gate.Refusal
		if held, r = s.gate.Follow(*tk, ctx.RemoteAddr()); r != nil {
			s.refuse(ctx, r)
			return
		}
	}
	lines, f, err := lr.Logs(callCtx(ctx), name, since, follow)
	if f == nil {
		held.Done()
	}
	if err != nil {
		s.fail(ctx, err)
		return
	}
	ctx.SetContentType("application/x-ndjson")
	ctx.Response.Header.Set("Cache-Control", "no-store")
	if f == nil {
		enc := json.NewEncoder(ctx)
		for i := range lines {
			enc.Encode(&lines[i])
		}
		return
	}
	// The status and headers go at once: a client following a quiet
	// function learns that it follows, and that this server sends
	// keep-alives, so that it may time the stream's silence from the
	// start (a chatty function's stream carries none).
	ctx.Response.ImmediateHeaderFlush = true
	ctx.Response.Header.Set("X-Plover-Keep-Alive", followKeepAlive.String())
	conn := ctx.Conn()
	allowed := s.stillAllowed(ctx, name)
	route := "GET " + string(ctx.Path()) // the stream outlives ctx
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer held.Done()
		defer s.streamRecovered(route, name, conn)
		s.follow(w, conn, lines, f, allowed)
	})
}

// stillAllowed is the check a followed stream of name's output makes as it
// runs (follow): its token must still have read on name, or a token
// removed from the auth file or narrowed away from the function by a
// reload would go on receiving the function's output for as long as its
// holder keeps the connection open. Without tokens there is nothing to
// check (nil).
func (s *Server) stillAllowed(ctx *fasthttp.RequestCtx, name string) func() bool {
	if s.gate.Open() {
		return nil
	}
	// A copy: the stream outlives the request, whose buffers fasthttp
	// reuses once the handler returns.
	authorization := bytes.Clone(ctx.Request.Header.PeekBytes(hdrAuthorization))
	return func() bool {
		r := s.gate.Check(authorization, auth.Read, name)
		if r != nil {
			s.opts.Log.Info("followed log stream ended: its token no longer reads the function", "function", name, "reason", r.Reason)
		}
		return r == nil
	}
}

// follow writes lines, then f's lines as they come, flushing after each
// burst, until the client goes (a write fails, or its end of conn is
// closed), f ends (the function was deleted), the server is draining or,
// asked before a burst or on a poll at most once a poll, allowed (nil:
// always) says the request's token may no longer read the function. The stream then
// just ends: its lines are the function's, and a note among them would be
// read as the function's own.
func (s *Server) follow(w *bufio.Writer, conn net.Conn, lines []api.LogLine, f *funclog.Follower, allowed func() bool) {
	defer f.Close()
	// Asked at most once a poll: a function printing line by line makes
	// every line a burst, and each ask hashes the token and takes the
	// gate's locks.
	var asked time.Time
	still := func() bool {
		if allowed == nil {
			return true
		}
		if now := time.Now(); now.Sub(asked) >= followPoll {
			asked = now
			return allowed()
		}
		return true
	}
	enc := json.NewEncoder(w)
	// Every write runs under a fresh deadline, set before a burst is
	// encoded and renewed as a long one goes on: the encoder writes
	// through w's buffer by itself once it fills, and a deadline left
	// from the last burst, or the start of this one, may have passed.
	var last time.Time
	start := func() { last = time.Now(); conn.SetWriteDeadline(last.Add(followWrite)) }
	start()
	for i := range lines {
		enc.Encode(&lines[i])
	}
	if w.Flush() != nil {
		return
	}
	tick := time.NewTicker(followPoll)
	defer tick.Stop()
	for {
		select {
		case l, ok := <-f.C:
			if ok && !still() {
				return
			}
			start()
			for ok {
				// A function printing without a pause keeps f.C from
				// emptying: one burst then lasts as long as it prints,
				// and under the deadline of its start a client reading
				// all along was cut after followWrite. The bound is each
				// write's: renewed as the burst goes on.
				if time.Since(last) >= followWrite/4 {
					start()
				}
				// Nor does the stream outlive a drain or its token's
				// right, asked on the tick only between bursts.
				if s.notReady.Load() || !still() {
					w.Flush()
					return
				}
				if enc.Encode(&l) != nil {
					return
				}
				if len(f.C) == 0 {
					break
				}
				l, ok = <-f.C // what else is queued goes in the same flush
			}
			// With f.C emptied (or closed), the last line this client
			// missed, if it fell behind, and how many before it: no later
			// line need come to bring them (a burst's end, a crash, a
			// delete). A line is missed only while f.C holds lines, which
			// the loop then reads to here: asking each time f.C empties
			// is enough, no tick need ask.
			if m, missed := f.Missed(); missed && enc.Encode(&m) != nil {
				return
			}
			if w.Flush() != nil || !ok {
				return
			}
		case <-tick.C:
			// Bytes from the client end it as its going does: a request
			// pipelined behind a stream that does not end could never be
			// answered (answers go in order), and a browser's TLS
			// close_notify is such bytes, which hide the socket's end from
			// a peek (its place among the token's streams was held until a
			// keep-alive write failed, 15-30 s).
			if s.notReady.Load() || peek(conn) != peekNothing || !still() {
				return
			}
			if time.Since(last) >= followKeepAlive {
				start()
				if w.WriteByte('\n') != nil || w.Flush() != nil {
					return
				}
			}
		}
	}
}
