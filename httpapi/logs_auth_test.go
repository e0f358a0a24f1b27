package httpapi_test

import (
	"bufio"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// A followed log stream is authorized when it starts and again as it runs:
// removing the token from the auth file (the README's rotation: "delete
// the old line, HUP"), or narrowing its globs away from the function, ends
// the streams it holds, before they carry another line. Otherwise a leaked
// or revoked read token would go on receiving a tenant's output for as
// long as its holder kept the connection open.
func TestFollowEndsWhenItsTokenIsRevoked(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after string // the dash token's auth line after the reload ("" gone)
		code  int    // what a fresh request with it gets then
	}{
		{"token removed", "", http.StatusUnauthorized},
		{"globs narrowed to another function", "g", http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer httpapi.SetFollowTimes(30*time.Second, time.Hour)() // no keep-alive noise
			dash, err := auth.NewToken()
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(t.TempDir(), "tokens")
			write := func(fns string) {
				t.Helper()
				line := ""
				if fns != "" {
					line = auth.Line("dash", auth.Read, auth.Hash(dash), []string{fns}, auth.Limits{}) + "\n"
				}
				// One other token, so that the file is never empty.
				other := auth.Line("other", auth.Read, auth.Hash("x-other-token-x"), nil, auth.Limits{}) + "\n"
				if err := os.WriteFile(file, []byte(other+line), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			write("f")
			store, err := auth.Load(file)
			if err != nil {
				t.Fatal(err)
			}
			adm := logAdmin{store: funclog.New(nil), followers: make(chan *funclog.Follower, 4)}
			door := frontdoor.New(frontdoor.Config{Gate: gate.New(store, nil)})
			url := testkit.ServeWith(t, httpapi.New(door, adm, httpapi.Options{})) + "/v1/functions/f/logs"
			adm.store.Sink("f").Add(logLine("before revocation"))

			req, _ := http.NewRequest("GET", url+"?follow=true", nil)
			req.Header.Set("Authorization", "Bearer "+dash)
			resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("follow with the dash token: %v %v", resp, err)
			}
			defer resp.Body.Close()
			<-adm.followers
			lines := make(chan string, 16)
			go func() {
				defer close(lines)
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					var l api.LogLine
					if json.Unmarshal(sc.Bytes(), &l) == nil {
						lines <- l.Line
					}
				}
			}()
			if got := <-lines; got != "before revocation" {
				t.Fatalf("backlog: %q", got)
			}

			// Revoke, and see that the server's gate has taken it.
			write(tc.after)
			if err := store.Reload(); err != nil {
				t.Fatal(err)
			}
			if code, _, _ := v2Do(t, "GET", url, map[string]string{"Authorization": "Bearer " + dash}, nil); code != tc.code {
				t.Fatalf("a fresh request after the reload: %d, want %d", code, tc.code)
			}

			adm.store.Sink("f").Add(logLine("printed after revocation"))
			select {
			case got, open := <-lines:
				if open {
					t.Fatalf("the revoked token's stream still carries the function's output: got %q after the reload", got)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the revoked token's stream is still open 5 s after the reload")
			}
		})
	}
}
