package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/plover-run/plover/api"
)

func logsCmd() *command {
	var ep endpoint
	var follow, asJSON bool
	var since time.Duration
	return &command{
		nargs: 1,
		named: true,
		name:  "logs", summary: "show what a function printed (its workers' stdout and stderr, kept by the server)",
		complete: ep.completeFunctions,
		usage:    "NAME [--follow] [--since 10m] [--json]",
		example: "  plover logs saxpy\n" +
			"  plover logs saxpy --since 5m --follow   # the last 5 minutes, then each new line as it comes (^C stops)",
		flags: func(fs *flag.FlagSet) {
			ep.serverFlag(fs)
			fs.BoolVar(&follow, "follow", false, "keep printing new lines as the function writes them, until interrupted or the server ends the stream; exit 1 when the answer has not started within "+followStart.String()+", or when the stream of a server that sends keep-alives (an empty line after "+followKeepAlive.String()+" without a line, said by its X-Plover-Keep-Alive header or seen; older servers send none and are not timed) sends nothing for "+followIdle.String())
			fs.DurationVar(&since, "since", 0, "only lines from this long ago on (default: all the server keeps, the last 1000 lines or 256 KiB)")
			fs.BoolVar(&asJSON, "json", false, "print the server's lines as they come: one JSON object a line (time, stream, pid, line)")
		},
		run: func(fs *flag.FlagSet, args []string, env *Env) error {
			if since < 0 {
				return usagef(env, "logs", "--since %v: want a positive duration", since)
			}
			q := url.Values{}
			if since > 0 {
				q.Set("since", since.String())
			}
			if follow {
				q.Set("follow", "true")
			}
			path := "/v1/functions/" + url.PathEscape(args[0]) + "/logs"
			if len(q) > 0 {
				path += "?" + q.Encode()
			}
			c := ep.client()
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			var body io.Reader
			if follow {
				r, done, err := openFollow(ctx, cancel, c, path)
				if err != nil {
					return err
				}
				defer done()
				body = r
			} else {
				resp, err := c.do(http.MethodGet, path, "", nil)
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				body = resp.Body
			}
			if err := printLogs(body, env.Stdout, asJSON); err != nil {
				if cause := context.Cause(ctx); cause != nil && cause != ctx.Err() {
					return cause
				}
				var ne net.Error
				if errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne) {
					return fmt.Errorf("the log stream from %s broke off (%v): the server went away or the connection was cut", c.base, err)
				}
				return err
			}
			if follow {
				// The server ends a followed stream only when the function
				// was deleted, it is shutting down, or the token no longer
				// reads the function: not what --follow's user waits for.
				fmt.Fprintf(env.Stderr, "plover logs: the server ended the stream (the function was deleted, the server is shutting down, or the token no longer reads %s)\n", args[0])
			}
			return nil
		},
	}
}

// openFollow opens a followed log stream at path, watched: cancel ends ctx,
// with its cause, when the answer has not started within followStart or
// the stream then falls silent (readWatch). done stops the watch and
// closes the stream.
func openFollow(ctx context.Context, cancel context.CancelCauseFunc, c *client, path string) (_ io.Reader, done func(), _ error) {
	// The stream lasts until it is interrupted, so no overall
	// bound: a watch instead, on the answer's start and then on
	// the keep-alives a live stream carries. Without one, a
	// server gone without a trace held --follow forever.
	var started atomic.Bool
	var silence atomic.Int64 // the silence that ends it
	silence.Store(int64(followIdle))
	t := time.AfterFunc(followStart, func() {
		if !started.Load() {
			cancel(fmt.Errorf("no answer to the log request within %v: gave up waiting", followStart))
			return
		}
		cancel(fmt.Errorf("the log stream from %s sent nothing for %v, though a live one sends a keep-alive line every %v: the server or the connection is gone", c.base, time.Duration(silence.Load()), followKeepAlive))
	})
	resp, err := c.bounded(followStart).doRequest(ctx, http.MethodGet, path, "", nil, -1, nil)
	if err != nil {
		t.Stop()
		return nil, nil, err
	}
	started.Store(true)
	t.Stop() // readWatch arms it while a Read waits
	// A server that says it sends keep-alives is timed from
	// the start: a chatty function's stream carries none (the
	// server sends one only after a quiet followKeepAlive), and
	// a server gone then without a FIN held --follow forever.
	// One that does not say so is timed from its first
	// keep-alive on (those before the header), or not at all.
	idle := followIdle
	every, err := time.ParseDuration(resp.Header.Get("X-Plover-Keep-Alive"))
	if err == nil && every > 0 {
		idle = max(idle, 3*every)
		silence.Store(int64(idle))
	}
	w := &readWatch{r: resp.Body, idle: idle, t: t, on: err == nil && every > 0, prev: '\n'}
	return w, func() { t.Stop(); resp.Body.Close() }, nil
}

// followStart bounds the wait for a followed stream's start (the response
// headers), and followIdle its silence after: the server sends an empty
// line every followKeepAlive (httpapi's followKeepAlive), so three of them
// missed is a stream gone. Variables for the tests.
var (
	followStart     = 30 * time.Second
	followIdle      = 45 * time.Second
	followKeepAlive = 15 * time.Second
)

// readWatch reads a followed stream, t (which ends it) running only while
// a Read waits for the server: the time its reader takes to pass a line on
// is not the server's silence (a pager that stops reading blocks the
// writes, and a watch between Reads cut a live stream after idle). It is
// off until the first keep-alive, an empty line, shows the server sends
// them: a server older than the keep-alive sends none, and its quiet
// stream is not a dead one.
type readWatch struct {
	r    io.Reader
	idle time.Duration
	t    *time.Timer
	on   bool // a keep-alive came
	prev byte // the byte before this Read's, to see an empty line
}

func (w *readWatch) Read(p []byte) (int, error) {
	if w.on {
		w.t.Reset(w.idle)
	}
	n, err := w.r.Read(p)
	w.t.Stop()
	for _, b := range p[:n] {
		if w.on {
			break
		}
		w.on = b == '\n' && w.prev == '\n'
		w.prev = b
	}
	return n, err
}

// printLogs copies the server's NDJSON lines to w as they arrive: as they
// are with asJSON (but for the characters visibleJSON escapes), else one
// line each (logLine).
func printLogs(r io.Reader, w io.Writer, asJSON bool) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if len(sc.Bytes()) == 0 {
			continue // a followed stream's keep-alive
		}
		if asJSON {
			if _, err := fmt.Fprintf(w, "%s\n", visibleJSON(sc.Bytes())); err != nil {
				return err
			}
			continue
		}
		var l api.LogLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("the server sent a line that is not a log line (%v): %.200s", err, sc.Bytes())
		}
		if _, err := io.WriteString(w, logLine(l)); err != nil {
			return err
		}
	}
	return sc.Err()
}

// logLine renders one line for a person:
//
//	2026-05-01 10:00:00.123 stdout[4242] | the line
//
// in local time, preceded by a note when a followed stream missed lines.
func logLine(l api.LogLine) string {
	s := ""
	if l.Dropped > 0 {
		s = fmt.Sprintf("... %d lines not shown: this client read more slowly than the function printed\n", l.Dropped)
	}
	s += fmt.Sprintf("%s %s[%d] | %s", l.Time.Local().Format(time.DateTime+".000"), l.Stream, l.PID, visible(l.Line))
	if l.Truncated > 0 {
		s += fmt.Sprintf(" [%d more bytes cut]", l.Truncated)
	}
	return s + "\n"
}
