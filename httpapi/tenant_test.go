package httpapi_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/auth"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/gate"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// A deploy records the deploying token's name as the version's tenant (the
// name, never the token), "" without an auth file; the versions listing
// shows it. Equal bytes deployed by another token make a version of that
// token's: the function runs as whoever deployed it last.
func TestDeployRecordsTheTenant(t *testing.T) {
	toks := map[string]string{}
	var lines []string
	for _, n := range []string{"acme", "globex"} {
		tok, err := auth.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		toks[n] = tok
		lines = append(lines, auth.Line(n, auth.Deploy|auth.Invoke, auth.Hash(tok), []string{"*"}, auth.Limits{}))
	}
	tab, err := auth.Parse(strings.NewReader(strings.Join(lines, "\n")+"\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	b, _, _, err := bundle.PackBytes(testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		tokens  gate.Tokens // nil: no auth file
		deploys []string    // tokens, in order
		want    []string    // the versions' tenants, oldest first
	}{
		{"no auth file", nil, []string{""}, []string{""}},
		{"one token", tab, []string{"acme"}, []string{"acme"}},
		{"same token again", tab, []string{"acme", "acme"}, []string{"acme"}},
		{"another token", tab, []string{"acme", "globex"}, []string{"acme", "globex"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := testkit.Engine(t, engine.Config{})
			url := testkit.ServeTokens(t, e, tt.tokens, httpapi.Options{})
			for _, who := range tt.deploys {
				if code, body := tenantDo(t, "PUT", url+"/v1/functions/echo", toks[who], b); code/100 != 2 {
					t.Fatalf("deploy as %q: %d %s", who, code, body)
				}
			}
			code, body := tenantDo(t, "GET", url+"/v1/functions/echo/versions", toks[tt.deploys[0]], nil)
			if code != 200 {
				t.Fatalf("versions: %d %s", code, body)
			}
			var rec api.Record
			if err := json.Unmarshal(body, &rec); err != nil {
				t.Fatalf("versions: %v in %s", err, body)
			}
			var got []string
			for _, v := range rec.Versions {
				got = append(got, v.Tenant)
			}
			if len(got) != len(tt.want) || strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Fatalf("tenants %q, want %q", got, tt.want)
			}
			for _, tok := range toks {
				if bytes.Contains(body, []byte(tok)) {
					t.Fatalf("the listing holds a token: %s", body)
				}
			}
		})
	}
}

func tenantDo(t *testing.T, method, url, token string, body []byte) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, bytes.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if method == "PUT" {
		req.Header.Set("Content-Type", bundle.MediaType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	out.ReadFrom(resp.Body)
	return resp.StatusCode, out.Bytes()
}
