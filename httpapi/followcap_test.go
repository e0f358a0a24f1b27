package httpapi_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// One holder of followed log streams, a token without a concurrency limit
// or, without tokens, one client, holds at most gate.MaxStreams of them,
// spread over functions as it likes; past them its follow is 429 naming
// the token (never the token itself) or the client, and another token
// still follows. Before, only funclog's bounds held (32 a function, 1,024
// a node): one read token of functions "*" could hold them all.
func TestLogsFollowIsBoundedPerHolder(t *testing.T) {
	defer httpapi.SetFollowTimes(30*time.Second, time.Hour)() // no keep-alive lines
	wide, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	other, err := auth.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "tokens")
	lines := auth.Line("wide", auth.Read, auth.Hash(wide), []string{"*"}, auth.Limits{}) + "\n" +
		auth.Line("other", auth.Read, auth.Hash(other), []string{"*"}, auth.Limits{}) + "\n"
	if err := os.WriteFile(file, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := auth.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name         string
		gate         *gate.Gate
		token, other string // "": none sent
		says         string
	}{
		{"a token without limits", gate.New(store, nil), wide, other, "token wide has 32 followed log streams open"},
		{"a client without tokens", gate.New(nil, nil), "", "", "client 127.0.0.1 has 32 followed log streams open"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			adm := logAdmin{store: funclog.New(nil), followers: make(chan *funclog.Follower, gate.MaxStreams+1)}
			door := frontdoor.New(frontdoor.Config{Gate: tc.gate})
			base := testkit.ServeWith(t, httpapi.New(door, adm, httpapi.Options{}))
			client := &http.Client{Timeout: 30 * time.Second}
			follow := func(token, fn string) (*http.Response, string) {
				t.Helper()
				req, _ := http.NewRequest("GET", base+"/v1/functions/"+fn+"/logs?follow=true", nil)
				if token != "" {
					req.Header.Set("Authorization", "Bearer "+token)
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				if resp.StatusCode == http.StatusOK {
					t.Cleanup(func() { resp.Body.Close() })
					return resp, ""
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				return resp, fmt.Sprint(resp.StatusCode, " ", string(body))
			}
			// Spread over functions: no function reaches funclog's 32.
			for i := range gate.MaxStreams {
				if _, refused := follow(tc.token, fmt.Sprint("f", i%4)); refused != "" {
					t.Fatalf("stream %d of %d: %s", i+1, gate.MaxStreams, refused)
				}
				<-adm.followers
			}
			resp, refused := follow(tc.token, "g")
			if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(refused, tc.says) || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("stream %d: status %d %s (Retry-After %q), want 429 saying %q", gate.MaxStreams+1, resp.StatusCode, refused, resp.Header.Get("Retry-After"), tc.says)
			}
			if tc.token != "" && strings.Contains(refused, tc.token) {
				t.Fatalf("the refusal quotes the token: %s", refused)
			}
			if tc.other != "" {
				if _, refused := follow(tc.other, "g"); refused != "" {
					t.Fatalf("another token was refused: %s", refused)
				}
				<-adm.followers
			}
		})
	}
}
