package httpapi_test

import (
	"bytes"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// An inference header of many small parts within the body limit (here
// 2 MiB of JSON for a function taking 64 KiB) decoded to a hundred bytes
// a part: a 60 MB header of empty inputs raised a server to 11 GB. It is
// refused (400, naming the bound) with about the memory of its body and
// of the parts read before the bound (2 MiB, 4 as their slice grows), by
// either reader of the header (parse, or encoding/json for a header it
// leaves: a key in capitals).
func TestInflatingInferenceHeaderIsRefused(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	url := testkit.Serve(t, e, httpapi.Options{})
	for _, key := range []string{"inputs", "INPUTS"} {
		t.Run(key, func(t *testing.T) {
			body := `{"` + key + `":[` + strings.Repeat("{},", 2<<20/3-10) + `{}]}`
			var m0, m1 runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&m0)
			resp, err := http.Post(url+"/v2/models/echo/infer", "application/json", bytes.NewReader([]byte(body)))
			if err != nil {
				t.Fatal(err)
			}
			msg, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			runtime.ReadMemStats(&m1)
			if resp.StatusCode != 400 || !strings.Contains(string(msg), "the inference header holds more than 16384 values besides its tensors' data") {
				t.Fatalf("%d %s, want 400 naming the bound", resp.StatusCode, msg)
			}
			if alloc := m1.TotalAlloc - m0.TotalAlloc; alloc > 4*uint64(len(body))+(12<<20) {
				t.Errorf("the request allocated %d MiB for a %d KiB body", alloc>>20, len(body)>>10)
			}
		})
	}
}

// The same for /v1's JSON body: a chain of empty launches within the
// body's bound (twice max_input_bytes) decoded to ten times it.
func TestInflatingInvokeBodyIsRefused(t *testing.T) {
	e := testkit.Engine(t, engine.Config{})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	url := testkit.Serve(t, e, httpapi.Options{})
	body := `{"input":"","chain":[` + strings.Repeat("{},", 120<<10/3) + `{}]}`
	resp, err := http.Post(url+"/v1/functions/echo/invoke", "application/json", bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(msg), "body: holds more than 16384 JSON values") {
		t.Fatalf("%d %s, want 400 naming the bound", resp.StatusCode, msg)
	}
}
