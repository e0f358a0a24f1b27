package engine_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/pipeline"
	"github.com/plover-run/plover/reqmetrics"
)

// An invoke whose record the S3 store cannot read tells the client what
// failed, with the function, and none of the store's bucket, prefix or
// endpoint (any token's request may fail so); the server's log has them.
func TestAStoreFailureTellsTheClientNoBucketOrEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fail  func(ts *httptest.Server, denied *atomic.Bool)
		class string
	}{
		{"refused credentials", func(_ *httptest.Server, denied *atomic.Bool) { denied.Store(true) }, "the object store refused the server's credentials"},
		{"unreachable", func(ts *httptest.Server, _ *atomic.Bool) { ts.Close() }, "the object store did not answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PLOVER_S3_ENDPOINT", "")
			var denied atomic.Bool
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if !denied.Load() {
					w.WriteHeader(http.StatusOK) // the open's check of the bucket
					return
				}
				w.Header().Set("Content-Type", "application/xml")
				w.WriteHeader(http.StatusForbidden)
				if r.Method != http.MethodHead {
					w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>Access Denied</Message><BucketName>secret-bucket</BucketName></Error>`))
				}
			}))
			t.Cleanup(ts.Close)
			store, err := objectstore.NewS3(context.Background(), "secret-bucket", "hidden-prefix", objectstore.S3Options{Endpoint: ts.URL, Region: "us-east-1", AccessKey: "a", SecretKey: "s"})
			if err != nil {
				t.Fatal(err)
			}
			var logs testkit.LogBuffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			e := testkit.Engine(t, engine.Config{Store: store, Log: log})
			reg := prometheus.NewRegistry()
			door := frontdoor.New(frontdoor.Config{Runner: pipeline.New(e, nil), Gate: gate.New(nil, reg), Metrics: reqmetrics.New(reg), Log: log})
			url := testkit.ServeWith(t, httpapi.New(door, e.Control(), httpapi.Options{Log: log, Registry: reg}))
			tc.fail(ts, &denied)
			resp, body := testkit.Post(t, "POST", url+"/v1/functions/fn/invoke", "application/octet-stream", []byte("x"))
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("status %d (%s), want 503", resp.StatusCode, body)
			}
			for _, leak := range []string{"secret-bucket", "hidden-prefix", "http://", "s3://", "127.0.0.1"} {
				if strings.Contains(string(body), leak) {
					t.Errorf("the client's answer names %q: %s", leak, body)
				}
			}
			if !strings.Contains(string(body), "function fn") || !strings.Contains(string(body), tc.class) {
				t.Errorf("the client's answer %s does not name the function and say %q", body, tc.class)
			}
			for _, detail := range []string{"secret-bucket", "s3://secret-bucket/hidden-prefix", strings.TrimPrefix(ts.URL, "http://")} {
				if !strings.Contains(logs.String(), detail) {
					t.Errorf("the server's log lacks %q:\n%s", detail, logs.String())
				}
			}
		})
	}
}
