package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// deployAdmin reads a deploy's body as the engine's spool does, saying
// when it began, and records the tenant of each deploy that landed.
type deployAdmin struct {
	httpapi.Admin
	reading chan struct{}
	landed  chan string
}

func (a deployAdmin) DeployAs(_ context.Context, name, tenant string, body io.Reader, _ bool) (api.FunctionInfo, error) {
	a.reading <- struct{}{}
	if _, err := io.Copy(io.Discard, body); err != nil {
		return api.FunctionInfo{}, fmt.Errorf("deploy %s: reading the bundle: %w", name, err)
	}
	a.landed <- tenant
	return api.FunctionInfo{Name: name}, nil
}

// A deploy is authorized when its request arrives and again as its upload
// ends: an upload takes as long as its client keeps sending, and a deploy
// token removed from the auth file, or narrowed away from the function, by
// a reload meanwhile (a leaked token's revocation) must not land its code
// afterwards. A reload that leaves the token as it was lands the deploy.
func TestADeployIsAuthorizedAgainAsItsUploadEnds(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after string // the deployer's globs after the reload ("" gone)
		code  int
	}{
		{"token kept", "f", http.StatusCreated},
		{"token removed", "", http.StatusUnauthorized},
		{"globs narrowed to another function", "g", http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, err := auth.NewToken()
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(t.TempDir(), "tokens")
			write := func(fns string) {
				t.Helper()
				lines := auth.Line("other", auth.Read, auth.Hash("x-other-token-x"), nil, auth.Limits{}) + "\n"
				if fns != "" {
					lines += auth.Line("dep", auth.Deploy, auth.Hash(tok), []string{fns}, auth.Limits{}) + "\n"
				}
				if err := os.WriteFile(file, []byte(lines), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			write("f")
			store, err := auth.Load(file)
			if err != nil {
				t.Fatal(err)
			}
			adm := deployAdmin{reading: make(chan struct{}, 1), landed: make(chan string, 1)}
			door := frontdoor.New(frontdoor.Config{Gate: gate.New(store, nil)})
			base := testkit.ServeWith(t, httpapi.New(door, adm, httpapi.Options{MaxBodyBytes: 8 << 20}))

			const size = 2 << 20
			conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(30 * time.Second))
			head := fmt.Sprintf("PUT /v1/functions/f HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", tok, size)
			body := bytes.Repeat([]byte{7}, size)
			if _, err := conn.Write(append([]byte(head), body[:size/2]...)); err != nil {
				t.Fatal(err)
			}
			select {
			case <-adm.reading: // the upload is under way
			case <-time.After(20 * time.Second):
				t.Fatal("the deploy's upload did not begin")
			}
			write(tc.after)
			if err := store.Reload(); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Write(body[size/2:]); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			msg, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.code {
				t.Fatalf("the deploy whose token was reloaded mid-upload: %d %s, want %d", resp.StatusCode, msg, tc.code)
			}
			select {
			case tenant := <-adm.landed:
				if tc.code != http.StatusCreated || tenant != "dep" {
					t.Errorf("the deploy landed as tenant %q after the reload", tenant)
				}
			default:
				if tc.code == http.StatusCreated {
					t.Error("the deploy answered 201 but did not land")
				}
			}
			if tc.code != http.StatusCreated && !strings.Contains(string(msg), "asked again as the bundle's upload ended") {
				t.Errorf("the refusal says %s, want it to say the token was asked again", msg)
			}
		})
	}
}
