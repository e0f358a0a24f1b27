package cli

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/grpcapi"
	"github.com/plover-run/plover/netguard"
	"github.com/plover-run/plover/pipeline"
)

// frontDoor is what stands between the network and the API: the tokens, the
// TLS certificate, the connection cap and the body budget. SIGHUP re-reads
// the auth file and the certificate.
type frontDoor struct {
	f      *serveFlags
	log    *slog.Logger
	tokens *auth.Store // nil: no authentication
	budget *netguard.Budget
	cert   atomic.Pointer[tls.Certificate]
	guard  *netguard.Listener
	// gate, once the door is made (newDoor): a reload has it forget the
	// tokens it removed. Set after the reloader starts.
	gate atomic.Pointer[gate.Gate]
}

// capMessage says why a connection past --max-conns is refused.
const capMessage = "the server has its maximum of open connections (--max-conns), or this client its own (--max-conns-per-client); retry"

// rejectResponse is what an HTTP connection past --max-conns reads before
// it is closed.
var rejectResponse = unavailableResponse(capMessage)

// refuseWithin bounds a refusal that must speak first (TLS, HTTP/2): a
// client that has not read why by then is closed.
const refuseWithin = 2 * time.Second

// metricsRejectResponse is what a connection to --metrics-listen past its
// bounds reads before it is closed.
var metricsRejectResponse = unavailableResponse(fmt.Sprintf("the metrics listener (--metrics-listen) has its maximum of %d open connections, or this client its own %d; retry", metricsMaxConns, metricsPerClient))

// unavailableResponse is a whole 503 answer saying msg (no quotes in it).
func unavailableResponse(msg string) []byte {
	body := `{"error":{"code":"unavailable","message":"` + msg + `"}}`
	return fmt.Appendf(nil, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// The metrics listener's bounds: a scraper needs a connection or two, and
// without a bound per client one peer holding 64 silent connections (each
// for the read timeout, again and again) cut every scrape off.
const metricsMaxConns, metricsPerClient = 64, 8

func newFrontDoor(f *serveFlags, log *slog.Logger, reg prometheus.Registerer) (*frontDoor, error) {
	d := &frontDoor{f: f, log: log}
	if f.authFile != "" {
		st, err := auth.Load(f.authFile)
		if err != nil {
			return nil, fmt.Errorf("--auth-file: %w", err)
		}
		d.tokens = st
	}
	if (f.tlsCert == "") != (f.tlsKey == "") {
		return nil, fmt.Errorf("--tls-cert and --tls-key go together")
	}
	if f.tlsCert != "" {
		if err := d.loadCert(); err != nil {
			return nil, err
		}
	}
	if err := mibFlag("max-body-memory", f.maxBodyMemMB, 0); err != nil {
		return nil, err
	}
	d.budget = netguard.NewBudget(f.maxBodyMemMB << 20)
	nofile, err := netguard.RaiseNoFileLimit()
	if err != nil {
		log.Warn("cannot raise the open-file limit", "error", err)
	}
	maxConns := f.maxConns
	if maxConns < 0 {
		return nil, fmt.Errorf("--max-conns %d: want 0 (derived) or more", maxConns)
	}
	if maxConns == 0 {
		maxConns = netguard.DefaultMaxConns(nofile)
	}
	perClient := f.maxConnsPerClient
	if perClient < 0 {
		return nil, fmt.Errorf("--max-conns-per-client %d: want 0 (half of --max-conns) or more", perClient)
	}
	if perClient == 0 {
		perClient = max(1, maxConns/2)
	}
	d.guard = &netguard.Listener{Max: maxConns, PerClient: perClient, Reject: rejectResponse}
	rejected := prometheus.NewCounter(prometheus.CounterOpts{Name: "plover_connections_rejected_total",
		Help: "Connections closed at once because --max-conns were open, or --max-conns-per-client from one address."})
	acceptErrs := prometheus.NewCounter(prometheus.CounterOpts{Name: "plover_accept_errors_total",
		Help: "Accept errors (out of descriptors, ...) the server retried after a back-off."})
	reg.MustRegister(rejected, acceptErrs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "plover_connections_open",
		Help: "Client connections open now."}, func() float64 { return float64(d.guard.Open()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "plover_body_memory_bytes",
			Help: "Bytes of request bodies and gRPC inference messages held in memory now, of --max-body-memory."}, func() float64 { return float64(d.budget.InUse()) }))
	var mu sync.Mutex
	var lastLog time.Time
	d.guard.OnReject = func() { rejected.Inc() }
	d.guard.OnError = func(err error) {
		acceptErrs.Inc()
		mu.Lock()
		defer mu.Unlock()
		if time.Since(lastLog) > time.Second {
			lastLog = time.Now()
			log.Warn("accept failed; retrying after a back-off", "error", err, "open_connections", d.guard.Open())
		}
	}
	log.Info("connection limits", "max_conns", maxConns, "max_conns_per_client", perClient, "open_file_limit", nofile, "max_body_memory_mib", f.maxBodyMemMB)
	return d, nil
}

func (d *frontDoor) loadCert() error {
	c, err := tls.LoadX509KeyPair(d.f.tlsCert, d.f.tlsKey)
	if err != nil {
		return fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	d.cert.Store(&c)
	return nil
}

func (d *frontDoor) authSummary() string {
	if d.tokens == nil {
		return "none"
	}
	return fmt.Sprintf("%d tokens from %s", d.tokens.Len(), d.tokens.Path())
}

// listen opens --listen behind the connection guard (and TLS), refusing a
// non-loopback address without tokens unless --insecure-no-auth, and starts
// the SIGHUP reloader and the no-auth reminder, both until ctx ends.
func (d *frontDoor) listen(ctx context.Context) (net.Listener, string, error) {
	ln, err := net.Listen("tcp", d.f.listen)
	if err != nil {
		return nil, "", fmt.Errorf("--listen %s: %w", d.f.listen, err)
	}
	if err := d.refuseExposed(ctx, ln, "--listen", d.f.listen, "deploy native code and run it here"); err != nil {
		return nil, "", err
	}
	d.guard.Listener = ln
	var out net.Listener = d.guard
	scheme := "http"
	if d.cert.Load() != nil {
		// Plain text would only garble a TLS handshake: the 503 goes
		// after one, off the accepting goroutine.
		d.guard.Refuse = refuseTLS(d.tlsConfig(), func(c net.Conn, _ time.Time) {
			if _, err := c.Write(rejectResponse); err == nil {
				// Shut below TLS: its close_notify is written under a
				// deadline of its own, 5 s, past refuseWithin's.
				raw := c.(*tls.Conn).NetConn()
				netguard.CloseLingering(raw, raw)
			}
		})
		out = tls.NewListener(d.guard, d.tlsConfig())
		scheme = "https"
	}
	return out, scheme, nil
}

// refuseExposed closes ln and refuses it when it is not a loopback
// address and there are no tokens, unless --insecure-no-auth (then the
// reminder runs until ctx ends).
func (d *frontDoor) refuseExposed(ctx context.Context, ln net.Listener, flag, given, what string) error {
	a, ok := ln.Addr().(*net.TCPAddr)
	if ok && a.IP.IsLoopback() || d.tokens != nil {
		return nil
	}
	if !d.f.insecureNoAuth {
		ln.Close()
		// Named as the operator gave it: ":8080" listens as "[::]:8080",
		// which no one typed.
		where := given
		if ok && a.IP.IsUnspecified() {
			where += " (every address of this machine)"
		}
		return fmt.Errorf("%s %s is not a loopback address and there is no --auth-file: anyone who reaches it could %s. "+
			"Create tokens (plover token new NAME --scopes ...) and pass --auth-file FILE, or, on a network you trust, --insecure-no-auth", flag, where, what)
	}
	go d.remind(ctx, flag, ln.Addr().String())
	return nil
}

// listenGRPC opens --grpc-listen under the same connection cap as
// --listen (one count for both) and the same exposure rule; the TLS
// config, when there is a certificate, serves the one SIGHUP reloads.
func (d *frontDoor) listenGRPC(ctx context.Context) (net.Listener, *tls.Config, error) {
	ln, err := net.Listen("tcp", d.f.grpcListen)
	if err != nil {
		return nil, nil, fmt.Errorf("--grpc-listen %s: %w", d.f.grpcListen, err)
	}
	if err := d.refuseExposed(ctx, ln, "--grpc-listen", d.f.grpcListen, "run every function deployed here"); err != nil {
		return nil, nil, err
	}
	// Past the cap a call is answered UNAVAILABLE saying why, in
	// HTTP/2 (and TLS first where there is a certificate).
	refuse := func(c net.Conn) { grpcapi.Refuse(c, capMessage, time.Now().Add(refuseWithin)) }
	var conf *tls.Config
	if d.cert.Load() != nil {
		conf = d.tlsConfig()
		h2 := d.tlsConfig()
		h2.NextProtos = []string{"h2"} // gRPC-Go's clients require it
		refuse = refuseTLS(h2, func(c net.Conn, deadline time.Time) { grpcapi.Refuse(c, capMessage, deadline) })
	}
	g := &netguard.Listener{Listener: ln, Share: d.guard, Refuse: refuse, OnError: d.guard.OnError, OnReject: d.guard.OnReject}
	return g, conf, nil
}

// refuseTLS is a netguard Refuse that says why, with then, over TLS: the
// handshake and then are bounded by refuseWithin together (then is given
// the deadline). The socket is closed, not the TLS connection, whose
// close writes its alert under a deadline of its own, 5 s.
func refuseTLS(conf *tls.Config, then func(net.Conn, time.Time)) func(net.Conn) {
	return func(c net.Conn) {
		defer c.Close()
		t := tls.Server(c, conf)
		deadline := time.Now().Add(refuseWithin)
		if t.SetDeadline(deadline) != nil || t.Handshake() != nil {
			return
		}
		then(t, deadline)
	}
}

// tlsConfig serves the certificate SIGHUP reloads.
func (d *frontDoor) tlsConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return d.cert.Load(), nil },
	}
}

// listenMetrics opens --metrics-listen behind a small connection cap of its
// own, so that scrapes cannot spend the API's descriptors.
func (d *frontDoor) listenMetrics() (net.Listener, error) {
	ln, err := net.Listen("tcp", d.f.metricsListen)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen %s: %w", d.f.metricsListen, err)
	}
	if a, ok := ln.Addr().(*net.TCPAddr); ok && !a.IP.IsLoopback() {
		// It answers anyone who reaches it, with more than a read token
		// shows (a review's finding): say so where the operator looks.
		d.log.Warn("--metrics-listen: /metrics without authentication on a non-loopback address names every tenant's functions, pipelines and limited tokens, and their request rates, to anyone who reaches it: keep it on a network only the scraper reaches", "addr", ln.Addr().String())
	}
	return &netguard.Listener{Listener: ln, Max: metricsMaxConns, PerClient: metricsPerClient, Reject: metricsRejectResponse, OnError: d.guard.OnError}, nil
}

// remind logs that listener flag (at addr) is open to anyone, at start and
// every hour: one reminder per exposed listener.
func (d *frontDoor) remind(ctx context.Context, flag, addr string) {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		d.log.Warn("--insecure-no-auth: no authentication on a non-loopback address; anyone who reaches it can deploy and run native code, including any web page a browser on this machine or network opens (DNS rebinding)", "flag", flag, "addr", addr)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reloadOnHUP re-reads the tokens and the certificate on every signal on hup
// (SIGHUP, taken over from its default, exit, as the server starts) until
// ctx ends.
func (d *frontDoor) reloadOnHUP(ctx context.Context, hup chan os.Signal) {
	// hup stays registered after ctx ends: with it stopped, a SIGHUP
	// would take its default again and end the process.
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		if d.tokens != nil {
			switch err := d.tokens.Reload(); {
			case err != nil:
				// The error says which of the previous tokens stay.
				d.log.Error("SIGHUP: the auth file did not load", "error", err, "tokens", d.tokens.Len())
			case d.tokens.Len() == 0:
				d.log.Warn("SIGHUP: the auth file names no token: every request that needs one is refused", "file", d.tokens.Path())
			default:
				d.log.Info("SIGHUP: tokens reloaded", "tokens", d.tokens.Len(), "file", d.tokens.Path())
			}
			if g := d.gate.Load(); g != nil {
				g.Forget(d.tokens.Has) // those the table holds now, whatever the reload's error
			}
		}
		if d.f.tlsCert != "" {
			if err := d.loadCert(); err != nil {
				d.log.Error("SIGHUP: the certificate did not load; the previous one stays in use", "error", err)
			} else {
				d.log.Info("SIGHUP: certificate reloaded", "cert", d.f.tlsCert)
			}
		}
	}
}

// topMiB is the most MiB a size flag takes: in bytes it must fit an int64,
// past which the shift wrapped (--max-body-memory 2^44+1 made a budget of
// 1 MiB, 2^43 a negative one: no limit).
const topMiB = math.MaxInt64 >> 20

// mibFlag checks the value of --name, a size in MiB, against least..topMiB
// (least 0: 0 means no limit).
func mibFlag(name string, v, least int64) error {
	if v >= least && v <= topMiB {
		return nil
	}
	if least == 0 {
		return fmt.Errorf("--%s %d: want 0 (no limit) to %d MiB", name, v, topMiB)
	}
	return fmt.Errorf("--%s %d: want %d to %d MiB", name, v, least, topMiB)
}

// spoolBudget is --max-spool in bytes (checked by checkServeFlags): where
// it is 0, 4 times the bundle bound maxBundle (at most what an int64
// holds), and at least 1 GiB, so that a few deploys of the largest
// bundles spool at once, and a tenant holding its part (all but one
// bundle: engine/spool.go) leaves others room.
func spoolBudget(mib, maxBundle int64) int64 {
	if mib > 0 {
		return mib << 20
	}
	if maxBundle > math.MaxInt64/4 {
		return math.MaxInt64
	}
	return max(4*maxBundle, 1<<30)
}

// boundPipelines holds run's pipeline requests' step outputs within mib
// MiB (--max-pipeline-memory, checked by checkServeFlags; 0: no bound), a
// budget of its own beside --max-body-memory's, which a pipeline request
// holds while it waits for room here.
func boundPipelines(run *pipeline.Runner, mib int64, reg prometheus.Registerer) {
	outs := netguard.NewOrderedBudget(mib << 20)
	run.Bound(outs)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "plover_pipeline_memory_bytes",
		Help: "Bytes of pipeline steps' outputs that running pipeline requests hold room for now, of --max-pipeline-memory."}, func() float64 { return float64(outs.InUse()) }))
}
