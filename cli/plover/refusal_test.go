package main_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
)

// TestARefusedConnectionSaysWhy: past --max-conns an HTTP client reads a
// 503 naming the flag, and a gRPC client a call's UNAVAILABLE naming it,
// in plain text and over TLS (both were closed without a word over TLS,
// and gRPC's in plain text too).
func TestARefusedConnectionSaysWhy(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	bin := buildPlover(t)
	_, cert, key, caPEM := testkit.WriteCerts(t, t.TempDir())
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	tlsConf := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
	for _, withTLS := range []bool{false, true} {
		name := map[bool]string{false: "plain", true: "tls"}[withTLS]
		t.Run(name, func(t *testing.T) {
			args := []string{"--max-conns", "1", "--grpc-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"}
			creds := insecure.NewCredentials()
			if withTLS {
				args = append(args, "--tls-cert", cert, "--tls-key", key)
				creds = credentials.NewTLS(tlsConf)
			}
			srv := startIsoServer(t, bin, t.TempDir(), nil, args...)
			api, gaddr := apiURL(t, srv), grpcAddr(t, srv)
			dial(t, strings.TrimPrefix(strings.TrimPrefix(api, "http://"), "https://"))
			waitFor(t, 10*time.Second, "the held connection counted", func() bool {
				return metric(t, srv.url, "plover_connections_open") == 1
			})
			// Read on a connection of its own, with no request written: the
			// server answers a connection past the cap as it comes (after
			// the handshake over TLS), before any request, and net/http's
			// client took such an answer for a broken connection when it
			// came before it wrote its request (seen in a loaded run:
			// "Unsolicited response received on idle HTTP channel"); a
			// request written after the server closed could be reset.
			resp, err := readUnasked(api, tlsConf, withTLS)
			if err != nil {
				t.Fatalf("GET /healthz past --max-conns: %v; want a 503 saying why", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "(--max-conns)") {
				t.Fatalf("GET /healthz past --max-conns: %d %s; want a 503 naming --max-conns", resp.StatusCode, body)
			}
			conn, err := grpc.NewClient(gaddr, grpc.WithTransportCredentials(creds))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, err = pb.NewGRPCInferenceServiceClient(conn).ServerLive(ctx, &pb.ServerLiveRequest{})
			if st, _ := status.FromError(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "(--max-conns)") {
				t.Fatalf("a gRPC call past --max-conns: %v; want Unavailable naming --max-conns", err)
			}
			if got := metric(t, srv.url, "plover_connections_rejected_total"); got < 2 {
				t.Errorf("plover_connections_rejected_total = %v, want the 2 refusals counted", got)
			}
		})
	}
}

// readUnasked reads the answer base's server writes on a connection of
// its own (TLS with conf where withTLS) without being sent a request.
func readUnasked(base string, conf *tls.Config, withTLS bool) (*http.Response, error) {
	addr := strings.TrimPrefix(strings.TrimPrefix(base, "http://"), "https://")
	d := &net.Dialer{Timeout: 20 * time.Second}
	var c net.Conn
	var err error
	if withTLS {
		c, err = tls.DialWithDialer(d, "tcp", addr, conf)
	} else {
		c, err = d.Dial("tcp", addr)
	}
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	resp.Body = struct {
		io.Reader
		io.Closer
	}{resp.Body, c}
	return resp, nil
}
