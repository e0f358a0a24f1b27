package main_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/plover-run/plover/grpcapi/inferencepb"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/samples/cnn/model"
)

// grpcurl finds the pinned grpcurl scripts/install-grpcurl.sh builds (or
// $GRPCURL, or one on PATH); without one the test skips, unless
// PLOVER_REQUIRE_GRPCURL=1 (CI), where it fails.
func grpcurl(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("GRPCURL"); p != "" {
		return p
	}
	base := os.Getenv("PLOVER_GRPCURL_CACHE")
	if base == "" {
		if c, err := os.UserCacheDir(); err == nil {
			base = filepath.Join(c, "plover")
		}
	}
	if m, _ := filepath.Glob(filepath.Join(base, "grpcurl-*", "grpcurl")); len(m) > 0 {
		return m[len(m)-1]
	}
	if p, err := exec.LookPath("grpcurl"); err == nil {
		return p
	}
	msg := "grpcurl not found ($GRPCURL, the cache of scripts/install-grpcurl.sh, PATH): run `bash scripts/install-grpcurl.sh` (minutes, once)"
	if os.Getenv("PLOVER_REQUIRE_GRPCURL") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

var (
	grpcAddrRE    = regexp.MustCompile(`addr=grpcs?://(127\.0\.0\.1:\d+)`)
	metricsAddrRE = regexp.MustCompile(`msg="metrics without authentication" addr=http://(127\.0\.0\.1:\d+)/metrics`)
	apiURLRE      = regexp.MustCompile(`msg="plover serving" addr=(https?://127\.0\.0\.1:\d+)`)
)

func grpcAddr(t *testing.T, srv *isoServer) string {
	t.Helper()
	return loggedAddr(t, srv, grpcAddrRE, "gRPC")
}

// apiURL is the API's base URL as srv logged it once serving: srv.url is
// the first address logged, --metrics-listen's where it is set.
func apiURL(t *testing.T, srv *isoServer) string {
	t.Helper()
	srv.waitLog(t, `msg="plover serving"`)
	return loggedAddr(t, srv, apiURLRE, "API")
}

// metricsAddr is --metrics-listen's address as srv logged it.
func metricsAddr(t *testing.T, srv *isoServer) string {
	t.Helper()
	return loggedAddr(t, srv, metricsAddrRE, "metrics")
}

func loggedAddr(t *testing.T, srv *isoServer, re *regexp.Regexp, what string) string {
	t.Helper()
	m := re.FindStringSubmatch(srv.log.String())
	if m == nil {
		t.Fatalf("no %s address in the server log:\n%s", what, srv.log)
	}
	return m[1]
}

// TestGRPCServed: plover serve --grpc-listen against a client no one here
// wrote (grpcurl, with the protocol's .proto) and the generated Go client:
// health, the CNN on real held-out MNIST digits equal to the HTTP route
// byte for byte, the digits pipeline with typed contents, an unknown
// model, a missing and a wrong token, and the same request counts in
// /metrics.
func TestGRPCServed(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the samples and starts a server")
	}
	gcurl := grpcurl(t)
	bin := buildPlover(t)
	dir := t.TempDir()
	authFile := filepath.Join(dir, "tokens")
	toks := writeAuthFile(t, authFile, [][3]string{{"root", "admin", "*"}, {"reader", "read", "*"}})
	srv := startIsoServer(t, bin, t.TempDir(), nil, "--auth-file", authFile, "--grpc-listen", "127.0.0.1:0")
	addr := grpcAddr(t, srv)
	deployDigits(t, bin, []string{"PLOVER_SERVER=" + srv.url, "PLOVER_TOKEN=" + toks["root"]})
	params, held := cnnReference(t)
	proto := filepath.Join(testkit.Root(), "grpcapi", "inferencepb")

	curl := func(token, method, data string) (string, error) {
		args := []string{"-plaintext", "-import-path", proto, "-proto", "grpc_predict_v2.proto", "-max-time", "30"}
		if token != "" {
			args = append(args, "-H", "authorization: Bearer "+token)
		}
		if data != "" {
			args = append(args, "-d", data)
		}
		out, err := exec.Command(gcurl, append(args, addr, "inference.GRPCInferenceService/"+method)...).CombinedOutput()
		return string(out), err
	}
	t.Run("grpcurl", func(t *testing.T) {
		if out, err := curl("", "ServerLive", ""); err != nil || !strings.Contains(out, `"live": true`) {
			t.Fatalf("ServerLive: %v %s", err, out)
		}
		d := &held[0]
		img := floatBytes(d.Image()[:])
		req, _ := json.Marshal(map[string]any{"model_name": "cnn", "id": "g1",
			"inputs":             []map[string]any{{"name": "digit", "datatype": "FP32", "shape": []int{1, 784}}},
			"raw_input_contents": []string{base64.StdEncoding.EncodeToString(img)}})
		out, err := curl(toks["root"], "ModelInfer", string(req))
		if err != nil {
			t.Fatalf("ModelInfer: %v %s", err, out)
		}
		var resp struct {
			ID  string   `json:"id"`
			Raw []string `json:"rawOutputContents"`
		}
		if err := json.Unmarshal([]byte(out), &resp); err != nil || resp.ID != "g1" || len(resp.Raw) != 1 {
			t.Fatalf("ModelInfer answered %v: %s", err, out)
		}
		scores, _ := base64.StdEncoding.DecodeString(resp.Raw[0])
		want := pipeInvoke(t, srv.url, "cnn", img, "Authorization", "Bearer "+toks["root"]).ok(t, "cnn over HTTP")
		if !bytes.Equal(scores, want) {
			t.Fatalf("grpcurl's scores %x, HTTP's %x", scores, want)
		}
		for _, tc := range []struct{ name, token, data, want string }{
			{"unknown model", toks["root"], `{"model_name":"nope"}`, "NotFound"},
			{"missing token", "", string(req), "Unauthenticated"},
			{"read token", toks["reader"], string(req), "PermissionDenied"},
		} {
			if out, err := curl(tc.token, "ModelInfer", tc.data); err == nil || !strings.Contains(out, tc.want) {
				t.Errorf("%s: %v %s, want %s", tc.name, err, out, tc.want)
			}
		}
	})

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := pb.NewGRPCInferenceServiceClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+toks["root"])
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()

	counted := func() int {
		m := secDo(t, &http.Client{Timeout: 10 * time.Second}, "GET", srv.url+"/metrics", toks["root"], "", nil)
		v := regexp.MustCompile(`plover_requests_total\{code="200",function="digits"\} (\d+)`).FindStringSubmatch(m.body)
		if v == nil {
			return 0
		}
		n, _ := strconv.Atoi(v[1])
		return n
	}
	before, calls := counted(), 0
	t.Run("the digits pipeline, typed contents", func(t *testing.T) {
		for i := 0; i < len(held); i += 25 {
			calls++
			d := &held[i]
			px := make([]uint32, len(d.Pixels))
			for k, p := range d.Pixels {
				px[k] = uint32(p)
			}
			r, err := c.ModelInfer(ctx, &pb.ModelInferRequest{ModelName: "digits", Inputs: []*pb.ModelInferRequest_InferInputTensor{
				{Name: "pixels", Datatype: "UINT8", Shape: []int64{1, 28, 28}, Contents: &pb.InferTensorContents{UintContents: px}}}})
			if err != nil {
				t.Fatalf("digit %d: %v", i, err)
			}
			if len(r.Outputs) != 2 || r.Outputs[0].Name != "label" || len(r.Outputs[0].Contents.GetIntContents()) != 1 || len(r.Outputs[1].Contents.GetFp32Contents()) != 1 {
				t.Fatalf("digit %d: %v", i, r)
			}
			label := int(r.Outputs[0].Contents.GetIntContents()[0])
			if want := model.Argmax(params.Scores(d.Image())); label != want {
				t.Fatalf("digit %d: label %d, the reference model says %d", i, label, want)
			}
			viaHTTP := pipeInvoke(t, srv.url, "digits", d.Pixels[:], "Authorization", "Bearer "+toks["root"]).ok(t, "digits over HTTP")
			score := math.Float32frombits(binary.LittleEndian.Uint32(viaHTTP[4:]))
			if int(int32(binary.LittleEndian.Uint32(viaHTTP))) != label || r.Outputs[1].Contents.GetFp32Contents()[0] != score {
				t.Fatalf("digit %d: gRPC %v, HTTP %x", i, r.Outputs, viaHTTP)
			}
		}
	})

	t.Run("plover bench --grpc", func(t *testing.T) {
		in := filepath.Join(dir, "digit.bin")
		os.WriteFile(in, floatBytes(held[1].Image()[:]), 0o644)
		out := run(t, bin, []string{"PLOVER_SERVER=" + srv.url, "PLOVER_TOKEN=" + toks["root"]}, "bench", "cnn", "--in", in,
			"--grpc", "grpc://"+addr, "--requests", "200", "--json")
		var res struct {
			Requests, OK int
			Timing       struct {
				Responses int `json:"responses"`
			} `json:"server_ms"`
		}
		// Every answer carried its server-timing metadata.
		if err := json.Unmarshal([]byte(out), &res); err != nil || res.OK != 200 || res.Requests != 200 || res.Timing.Responses != 200 {
			t.Fatalf("bench --grpc: %v %s", err, out)
		}
	})

	// gRPC inferences count in the same series as HTTP's: each digit was
	// asked once over gRPC and once over HTTP.
	if got := counted() - before; got != 2*calls {
		t.Errorf("plover_requests_total{digits,200} grew by %d for %d gRPC and %d HTTP requests", got, calls, calls)
	}
	srv.mustBeHealthy(t, "after the gRPC cases")
}

func floatBytes(fs []float32) []byte {
	b := make([]byte, 0, 4*len(fs))
	for _, f := range fs {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
	}
	return b
}

// TestGRPCTLS: with --tls-cert, the gRPC port serves TLS with the same
// certificate (grpcurl and the Go client trust the test CA) and refuses
// plain text.
func TestGRPCTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds binaries and starts servers")
	}
	gcurl := grpcurl(t)
	bin := buildPlover(t)
	dir := t.TempDir()
	ca, cert, key, caPEM := testkit.WriteCerts(t, dir)
	srv := startIsoServer(t, bin, t.TempDir(), nil, "--tls-cert", cert, "--tls-key", key, "--grpc-listen", "127.0.0.1:0")
	addr := grpcAddr(t, srv)
	proto := filepath.Join(testkit.Root(), "grpcapi", "inferencepb")
	args := []string{"-import-path", proto, "-proto", "grpc_predict_v2.proto", "-max-time", "20"}
	out, err := exec.Command(gcurl, append(args, "-cacert", ca, addr, "inference.GRPCInferenceService/ServerReady")...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"ready": true`) {
		t.Fatalf("ServerReady over TLS: %v %s", err, out)
	}
	if out, err := exec.Command(gcurl, append(args, "-plaintext", addr, "inference.GRPCInferenceService/ServerLive")...).CombinedOutput(); err == nil {
		t.Fatalf("plain text to the TLS port answered: %s", out)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = pb.NewGRPCInferenceServiceClient(conn).ModelMetadata(ctx, &pb.ModelMetadataRequest{Name: "nope"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("ModelMetadata of an unknown model over TLS: %v", err)
	}
}

// TestGRPCHandshakeWithinReadTimeout: a connection to --grpc-listen that
// never finishes its handshake is closed after --read-timeout, as an HTTP
// connection that sends no request is: it holds a place under
// --max-conns, which both listeners share, and gRPC-Go's own bound is two
// minutes.
func TestGRPCHandshakeWithinReadTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	bin := buildPlover(t)
	const readTimeout = time.Second
	grpcListen := startServer(t, bin, "--read-timeout", readTimeout.String(), "--grpc-listen", "127.0.0.1:0").grpc
	for _, hello := range []string{"", "PRI * HTTP/2.0\r\n"} {
		c := dial(t, grpcListen)
		send(t, c, []byte(hello))
		start := time.Now()
		c.SetReadDeadline(start.Add(10 * readTimeout))
		_, err := io.Copy(io.Discard, c) // the server's settings, then its close
		if took := time.Since(start); err != nil || took > 5*readTimeout {
			t.Fatalf("a gRPC connection that sent %q was still open %v later (%v); want it closed after --read-timeout %v", hello, took.Round(time.Millisecond), err, readTimeout)
		}
	}
}

// inferBytes calls ModelInfer on name with in as its one input (UINT8),
// within 30 s.
func inferBytes(conn *grpc.ClientConn, name string, in []byte) (*pb.ModelInferResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return pb.NewGRPCInferenceServiceClient(conn).ModelInfer(ctx, &pb.ModelInferRequest{ModelName: name,
		Inputs: []*pb.ModelInferRequest_InferInputTensor{{Name: "INPUT0", Datatype: "UINT8", Shape: []int64{int64(len(in))}}}, RawInputContents: [][]byte{in}})
}

// TestSIGTERMDrainsInFlightGRPCCall: a gRPC call running as the server
// drains is answered, beside a connection that never finished its
// handshake (which the drain ends), and the server exits within its bound
// having cleaned up.
func TestSIGTERMDrainsInFlightGRPCCall(t *testing.T) {
	const grace = 8 * time.Second
	srv := servedWithGrace(t, grace, testkit.Slow("slow", 800), "--grpc-listen", "127.0.0.1:0")
	grpcListen := srv.grpc
	invokeHTTP(srv.url, "slow", []byte("warm"))
	dial(t, grpcListen)

	conn, err := grpc.NewClient(grpcListen, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	in := []byte("drain me")
	answer := make(chan error, 1)
	go func() {
		r, err := inferBytes(conn, "slow", in)
		if err == nil && (len(r.RawOutputContents) != 1 || !bytes.HasPrefix(r.RawOutputContents[0], in)) {
			err = fmt.Errorf("answered %v", r)
		}
		answer <- err
	}()
	waitFor(t, 10*time.Second, "the call to run", func() bool {
		return metric(t, srv.url, `plover_instances{function="slow",state="busy"}`) >= 1
	})
	start := time.Now()
	srv.cmd.Process.Signal(syscall.SIGTERM)
	if err := <-answer; err != nil {
		t.Errorf("gRPC call in flight during shutdown: %v", err)
	}
	stoppedWithin(t, srv, exited(t, srv, start, 3*grace), grace/2)
}
