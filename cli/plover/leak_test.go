package main_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/plover-run/plover/bundle"
	pb "github.com/plover-run/plover/grpcapi/inferencepb"
)

// Clients that misbehave in the ways a transport sees (gone mid-body,
// mid-answer, at their deadline, between pipelined requests, after a
// 100-continue, in a chunk; over gRPC cancelled, out of time, a
// connection cut mid-frame), beside a worker killed under them, leave
// nothing in the server once they are gone and its function is unloaded
// again: its goroutines and open files come back to what they were after
// a few well-behaved requests, and what requests hold (body memory,
// bodies reading, I/O pieces, queued requests, open connections) to 0, in
// either worker scope. A leak of one goroutine in twenty such requests
// shows (two rounds make about 100).
// Every 200 (every OK) is the request's own bytes.
func TestMisbehavingClientsLeaveNothingBehind(t *testing.T) {
	if testing.Short() {
		t.Skip("starts servers with worker processes")
	}
	bin := buildPlover(t)
	for _, scope := range []string{"function", "tenant"} {
		t.Run(scope, func(t *testing.T) { leaveNothingBehind(t, bin, scope) })
	}
}

// leaveNothingBehind is TestMisbehavingClientsLeaveNothingBehind with
// --worker-scope scope; a tenant's requests carry its token.
func leaveNothingBehind(t *testing.T, bin, scope string) {
	args := []string{"--isolation", "process", "--worker-scope", scope, "--grpc-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--idle-ttl", "1s", "--standby-workers", "0", "--timeout", "20s", "--max-instances", "4"}
	token := ""
	if scope == "tenant" {
		authFile := filepath.Join(t.TempDir(), "tokens")
		token = writeAuthFile(t, authFile, [][3]string{{"acme", "deploy,invoke,read", "*"}})["acme"]
		args = append(args, "--auth-file", authFile)
	}
	srv := startIsoServer(t, bin, t.TempDir(), nil, args...)
	api, metrics := apiURL(t, srv), "http://"+metricsAddr(t, srv)
	echoBigAs(t, bin, []string{"PLOVER_SERVER=" + api, "PLOVER_TOKEN=" + token}, "big")
	scrape := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	read := func() figures { return figuresOf(t, scrape, metrics) }
	g := &misbehaving{t: t, url: api, grpcAddr: grpcAddr(t, srv), token: token,
		hc: &http.Client{Transport: bearerRT{token: token, base: &http.Transport{MaxIdleConnsPerHost: 8}}, Timeout: 30 * time.Second}}
	g.dial()

	// The baseline: every transport and the function used once, the
	// clients gone, the function unloaded.
	for i := range 4 {
		if ok, bad := g.wellBehaved(rand.New(rand.NewPCG(uint64(i), 0)), 200, i); !ok {
			t.Fatalf("a well-behaved request before the rounds: %s", bad)
		}
	}
	g.leave()
	waitUnloaded(t, metrics, "big")
	base := settled(read)
	t.Logf("baseline: %v", base)

	for round := range uint64(2) {
		mixedClientsVia(t, g.hc, api, "big", 11+round, g.try)
	}
	g.leave()
	waitUnloaded(t, metrics, "big")
	var now figures
	for end := time.Now().Add(40 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		if now = read(); now.within(base) {
			t.Logf("after the rounds: %v", now)
			return
		}
		if time.Now().After(end) {
			break
		}
	}
	// What is left, in the server's own words: SIGQUIT dumps its
	// goroutines into its log, which the cleanup prints for a failed test.
	srv.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-srv.exited:
	case <-time.After(5 * time.Second):
	}
	t.Fatalf("40 s after the rounds, with the function unloaded: %v, against %v before them", now, base)
}

// figures are what a server holds, read from its /metrics: its goroutines
// and open files, and the gauges of what requests hold (each summed over
// its series), which are 0 at rest.
type figures map[string]float64

// held are the gauges of figures that requests hold.
var held = []string{"plover_body_memory_bytes", "plover_bodies_reading", "plover_io_pieces", "plover_queue_depth", "plover_connections_open"}

// slack is what a figure may be over its baseline at rest: the scrape's
// own connection, a timer; not one a request's.
var slack = map[string]float64{"go_goroutines": 3, "process_open_fds": 1}

func figuresOf(t *testing.T, client *http.Client, url string) figures {
	t.Helper()
	b := metricsText(t, client, url)
	f := figures{"go_goroutines": seriesIn(b, "go_goroutines"), "process_open_fds": seriesIn(b, "process_open_fds")}
	for _, name := range held {
		if !bytes.Contains(b, []byte("\n# TYPE "+name+" ")) {
			t.Fatalf("the server's /metrics has no %s", name)
		}
		for _, m := range regexp.MustCompile(`(?m)^`+name+`(?:\{[^}]*\})? (\S+)$`).FindAllSubmatch(b, -1) {
			v, _ := strconv.ParseFloat(string(m[1]), 64)
			f[name] += v
		}
	}
	return f
}

// within says whether every figure is at most base's, give or take its
// slack.
func (f figures) within(base figures) bool {
	for k, v := range f {
		if v > base[k]+slack[k] {
			return false
		}
	}
	return true
}

// settled is read's figures once they stop falling: fasthttp ends an
// idle worker goroutine 10 s after its last connection, a gRPC
// connection's goroutines end as it closes.
func settled(read func() figures) figures {
	f := read()
	low := time.Now()
	for end := time.Now().Add(40 * time.Second); time.Now().Before(end) && time.Since(low) < 12*time.Second; time.Sleep(250 * time.Millisecond) {
		for k, v := range read() {
			if v < f[k] {
				f[k], low = v, time.Now()
			}
		}
	}
	return f
}

// waitUnloaded waits, bounded, until fn has no instance (--idle-ttl).
func waitUnloaded(t *testing.T, url, fn string) {
	t.Helper()
	waitMetric(t, url, `plover_instances{function="`+fn+`",state="idle"}`, "none", func(v float64) bool { return v <= 0 })
	waitMetric(t, url, `plover_instances{function="`+fn+`",state="busy"}`, "none", func(v float64) bool { return v <= 0 })
}

// misbehaving makes the requests of TestMisbehavingClientsLeaveNothingBehind
// to "big" (echoBigAs) on a server over HTTP and gRPC.
type misbehaving struct {
	t        *testing.T
	url      string
	grpcAddr string
	token    string // sent with every request where not ""
	hc       *http.Client
	infer    func(context.Context, []byte) (*pb.ModelInferResponse, error)
	conn     *grpc.ClientConn
}

// dial opens the gRPC connection the clients share.
func (g *misbehaving) dial() {
	withToken := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if g.token != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+g.token)
		}
		return invoke(ctx, method, req, reply, cc, opts...)
	}
	conn, err := grpc.NewClient(g.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(withToken),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20), grpc.MaxCallSendMsgSize(16<<20)))
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { conn.Close() })
	g.conn, g.infer = conn, inferBig(pb.NewGRPCInferenceServiceClient(conn))
}

// leave closes every connection the clients keep, and dials anew.
func (g *misbehaving) leave() {
	g.hc.CloseIdleConnections()
	g.conn.Close()
	g.dial()
}

// try is one request of client c, half of them well-behaved (ok where
// answered with its own bytes), half not (never ok); bad says what was
// wrong with an answer.
func (g *misbehaving) try(rng *rand.Rand, c, i int) (bool, string) {
	if rng.IntN(2) == 0 {
		return g.wellBehaved(rng, c, i)
	}
	n := 1 + rng.IntN(2<<20)
	in := body(400+c, i, n)
	switch rng.IntN(12) {
	case 0: // gone mid-body
		conn := g.raw("POST", invokePath, fmt.Sprintf("Content-Length: %d\r\n\r\n", n))
		conn.Write(in[:n/2])
		conn.Close()
	case 1: // gone mid-answer
		if resp, err := g.hc.Post(g.url+"/v1/functions/big/invoke", "application/octet-stream", bytes.NewReader(in)); err == nil {
			io.CopyN(io.Discard, resp.Body, int64(n/3))
			resp.Body.Close()
		}
	case 2: // its deadline passes mid-body: a 504, then gone
		conn := g.raw("POST", invokePath, fmt.Sprintf("X-Plover-Timeout-Ms: 50\r\nContent-Length: %d\r\n\r\n", n+1))
		conn.Write(in)
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err == nil && resp.StatusCode == 200 {
			conn.Close()
			return false, "200 for a body one byte short"
		}
		conn.Close()
	case 3: // two requests at once, the second's answer never read
		conn := g.raw("POST", invokePath, fmt.Sprintf("Content-Length: %d\r\n\r\n", n))
		conn.Write(in)
		conn.Write(g.request("POST", invokePath, fmt.Sprintf("Content-Length: %d\r\n\r\n", n)))
		conn.Write(in)
		conn.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		bad := "the first answer: " + fmt.Sprint(err)
		if err == nil {
			_, bad = ownEcho(resp, in)
		}
		conn.Close()
		if bad != "" {
			return false, "pipelined: " + bad
		}
	case 4: // asks to continue, then leaves
		conn := g.raw("POST", invokePath, fmt.Sprintf("Expect: 100-continue\r\nContent-Length: %d\r\n\r\n", n))
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		conn.Read(make([]byte, 64))
		conn.Close()
	case 5: // a chunked body cut in a chunk
		conn := g.raw("POST", invokePath, fmt.Sprintf("Transfer-Encoding: chunked\r\n\r\n%x\r\n", n))
		conn.Write(in[:n/2])
		conn.Close()
	case 6: // a call cancelled as it goes
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); g.infer(ctx, in) }()
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
		cancel()
		<-done
	case 7: // a call out of time
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+rng.IntN(3))*time.Millisecond)
		resp, err := g.infer(ctx, in)
		cancel()
		if err == nil {
			if err := ownAnswer(resp, in); err != nil {
				return false, "a call near its deadline: " + err.Error()
			}
		}
	case 8: // a gRPC connection cut in its first message's frame
		conn, err := net.Dial("tcp", g.grpcAddr)
		if err != nil {
			return false, err.Error()
		}
		conn.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x40\x00\x00\x00\x00\x00\x00\x01"))
		conn.Close()
	case 9: // a deploy's upload cut midway
		conn := g.raw("PUT", "/v1/functions/big", fmt.Sprintf("Content-Type: %s\r\nContent-Length: %d\r\n\r\n", bundle.MediaType, n))
		conn.Write(in[:n/2])
		conn.Close()
	case 10: // the function's output followed, then left
		conn := g.raw("GET", "/v1/functions/big/logs?follow=true", "\r\n")
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if resp, err := http.ReadResponse(bufio.NewReader(conn), nil); err == nil && resp.StatusCode != 200 {
			conn.Close()
			return false, fmt.Sprintf("following the output: %d", resp.StatusCode)
		}
		conn.Close()
	case 11: // an Open Inference Protocol request whose JSON stops midway, then gone
		doc := fmt.Sprintf(`{"inputs":[{"name":"INPUT0","datatype":"UINT8","shape":[%d],"data":[1,2,3`, n)
		conn := g.raw("POST", "/v2/models/big/infer", fmt.Sprintf("Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(doc)+n, doc))
		conn.Close()
	}
	return false, ""
}

// wellBehaved is a whole request of client c over HTTP or gRPC: ok where
// the answer is its own bytes; a 5xx (a killed worker's) is neither.
func (g *misbehaving) wellBehaved(rng *rand.Rand, c, i int) (bool, string) {
	n := 1 + rng.IntN(2<<20)
	in := body(200+c, i, n)
	if rng.IntN(2) == 0 {
		resp, err := g.infer(context.Background(), in)
		if err != nil {
			return false, "" // a killed worker's call fails; which code is the gRPC tests'
		}
		if err := ownAnswer(resp, in); err != nil {
			return false, err.Error()
		}
		return true, ""
	}
	resp, err := g.hc.Post(g.url+"/v1/functions/big/invoke", "application/octet-stream", bytes.NewReader(in))
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	return ownEcho(resp, in)
}

// ownEcho reads resp, an answer to in: ok where it is a 200 of in's
// bytes; bad where it is a 200 of others, or neither a 200 nor a 5xx (a
// killed worker's).
func ownEcho(resp *http.Response, in []byte) (ok bool, bad string) {
	out, _ := io.ReadAll(resp.Body)
	switch {
	case resp.StatusCode == 200 && !bytes.Equal(out, in):
		return false, fmt.Sprintf("200 with %d bytes, not its own %d", len(out), len(in))
	case resp.StatusCode == 200:
		return true, ""
	case resp.StatusCode != 500 && resp.StatusCode != 503:
		return false, fmt.Sprintf("%d %s", resp.StatusCode, out)
	}
	return false, ""
}

const invokePath = "/v1/functions/big/invoke"

// raw opens a connection and sends a request's line and headers (request),
// ending with rest.
func (g *misbehaving) raw(method, path, rest string) net.Conn {
	conn, err := net.Dial("tcp", strings.TrimPrefix(g.url, "http://"))
	if err != nil {
		g.t.Error(err)
		c, other := net.Pipe() // goes nowhere: writes fail, reads end
		other.Close()
		return c
	}
	conn.Write(g.request(method, path, rest))
	return conn
}

// request is a request's line and headers, the token's among them, ending
// with rest (its last headers, the blank line); an invoke's body is
// application/octet-stream where rest says no other type.
func (g *misbehaving) request(method, path, rest string) []byte {
	b := fmt.Appendf(nil, "%s %s HTTP/1.1\r\nHost: localhost\r\n", method, path)
	if path == invokePath {
		b = append(b, "Content-Type: application/octet-stream\r\n"...)
	}
	if g.token != "" {
		b = append(b, "Authorization: Bearer "+g.token+"\r\n"...)
	}
	return append(b, rest...)
}
