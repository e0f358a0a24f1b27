package main_test

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/internal/testkit"
)

// TestClientSlotsComeBack: a connection closed in any state (silent,
// mid-headers, mid-body, mid-answer, after an early answer that lingers,
// after a whole exchange; over TLS mid-handshake or after a handshake the
// client refused; a gRPC one mid-preface or after it) gives its place
// under --max-conns-per-client back, each case more times than the cap:
// a count that leaked would lock the client out once it reached the cap.
func TestClientSlotsComeBack(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	bin := buildPlover(t)
	const perClient = 3
	ca, cert, key, caPEM := testkit.WriteCerts(t, t.TempDir())
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	post := func(path string, n int) []byte {
		return fmt.Appendf(nil, "POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n", path, n)
	}
	type step func(t *testing.T, c net.Conn)
	httpCases := []struct {
		name string
		do   step
	}{
		{"silent", func(*testing.T, net.Conn) {}},
		{"mid-headers", func(t *testing.T, c net.Conn) { c.Write([]byte("GET /v1/functions HTTP/1.1\r\nHo")) }},
		{"mid-body", func(t *testing.T, c net.Conn) {
			c.Write(append(post("/v1/functions/big/invoke", 4<<20), make([]byte, 256<<10)...))
		}},
		{"mid-answer", func(t *testing.T, c net.Conn) {
			c.Write(append(post("/v1/functions/big/invoke", 4<<20), make([]byte, 4<<20)...))
			io.ReadFull(c, make([]byte, 100))
		}},
		{"early-answer", func(t *testing.T, c net.Conn) {
			c.Write(append(post("/v1/functions/nope/invoke", 4<<20), make([]byte, 64<<10)...))
			io.ReadFull(c, make([]byte, 12))
		}},
		{"whole-exchange", func(t *testing.T, c net.Conn) {
			c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"))
			io.ReadFull(c, make([]byte, 12))
		}},
	}
	grpcCases := []struct {
		name string
		do   step
	}{
		{"grpc-silent", func(*testing.T, net.Conn) {}},
		{"grpc-mid-preface", func(t *testing.T, c net.Conn) { c.Write([]byte("PRI * HTTP/2.0\r\n")) }},
		{"grpc-preface", func(t *testing.T, c net.Conn) {
			c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"))
			io.ReadFull(c, make([]byte, 9))
		}},
	}
	for _, withTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", withTLS), func(t *testing.T) {
			args := []string{"--max-conns-per-client", fmt.Sprint(perClient), "--metrics-listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"}
			if withTLS {
				args = append(args, "--tls-cert", cert, "--tls-key", key)
			}
			srv := startIsoServer(t, bin, t.TempDir(), nil, args...)
			api := apiURL(t, srv)
			_, addr, _ := strings.Cut(api, "://")
			// Ports 0, read back: a port found free could be another
			// test's by the time the server binds it.
			grpcListen, metrics := grpcAddr(t, srv), metricsAddr(t, srv)
			wrap := func(c net.Conn) net.Conn { return c }
			type tc struct {
				name, addr string
				do         step
			}
			var cases []tc
			if withTLS {
				wrap = func(c net.Conn) net.Conn {
					tc := tls.Client(c, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
					tc.Handshake()
					return tc
				}
				cases = append(cases,
					tc{"tls-silent", addr, func(*testing.T, net.Conn) {}},
					tc{"tls-mid-hello", addr, func(t *testing.T, c net.Conn) { c.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01}) }},
					tc{"tls-refused-cert", addr, func(t *testing.T, c net.Conn) { tls.Client(c, &tls.Config{ServerName: "127.0.0.1"}).Handshake() }},
				)
			}
			big := testkit.Manifest("big")
			big.MaxInputBytes, big.OutBytes = 8<<20, 8<<20
			run(t, bin, []string{"PLOVER_SERVER=" + api, "PLOVER_CACERT=" + ca}, "deploy", testkit.BundleDir(t, big, nil))
			for _, h := range httpCases {
				h := h
				cases = append(cases, tc{h.name, addr, func(t *testing.T, c net.Conn) { h.do(t, wrap(c)) }})
			}
			for _, g := range grpcCases {
				if !withTLS {
					cases = append(cases, tc{g.name, grpcListen, g.do})
				}
			}
			url := "http://" + metrics
			waitFor(t, 10*time.Second, "no connection open", func() bool { return metric(t, url, "plover_connections_open") == 0 })
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					for i := 0; i < perClient+1; i++ {
						conn, err := net.Dial("tcp", c.addr)
						if err != nil {
							t.Fatal(err)
						}
						conn.SetDeadline(time.Now().Add(10 * time.Second))
						c.do(t, conn)
						conn.Close()
						waitFor(t, 10*time.Second, "the count to come back to 0", func() bool {
							return metric(t, url, "plover_connections_open") == 0
						})
					}
				})
			}
		})
	}
}
