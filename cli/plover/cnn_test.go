package main_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/samples/cnn/digits"
	"github.com/plover-run/plover/samples/cnn/model"
)

// TestCNNServed serves the CNN sample through a real plover serve on the
// host device and checks every committed held-out digit: the 10 scores
// against the Go reference forward pass, and the accuracy.
func TestCNNServed(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and serves the CNN")
	}
	root := testkit.Root()
	dir := t.TempDir()
	testkit.BuildLib(t, filepath.Join(root, "samples", "cnn", "cnn.cu"), dir, "cnn.so")
	for _, f := range []string{"plover.json", "weights.bin"} {
		b, err := os.ReadFile(filepath.Join(root, "samples", "cnn", f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, f), b, 0o644)
	}
	params, held := cnnReference(t)
	bin := buildPlover(t)
	srv := startServer(t, bin)
	run(t, bin, []string{"PLOVER_SERVER=" + srv.url}, "deploy", dir)

	correct, worst := 0, 0.0
	for i := range held {
		d := &held[i]
		code, out, err := invokeHTTP(srv.url, "cnn", d.Input())
		if err != nil || code != 200 {
			t.Fatalf("digit %d: %d %v", i, code, err)
		}
		got, err := model.DecodeScores(out)
		if err != nil {
			t.Fatalf("digit %d: %v", i, err)
		}
		want := params.Scores(d.Image())
		for c := range got {
			worst = max(worst, math.Abs(float64(got[c]-want[c])))
		}
		if worst > 1e-5 {
			t.Fatalf("digit %d: scores %v, reference %v", i, got, want)
		}
		if model.Argmax(got) == int(d.Label) {
			correct++
		}
	}
	acc := float64(correct) / float64(len(held))
	t.Logf("served CNN: %d/%d correct (%.2f%%), largest score difference from the reference %.2g", correct, len(held), 100*acc, worst)
	if acc < 0.90 {
		t.Fatalf("accuracy %.2f%% below 90%%", 100*acc)
	}
	// An input of the wrong size is the client's fault: the CNN refuses it
	// (plover_reject) and the client reads 422 with the CNN's message.
	code, out, err := invokeHTTP(srv.url, "cnn", make([]byte, 100))
	if err != nil || code != 422 || !strings.Contains(string(out), `"code":"invalid_input"`) || !strings.Contains(string(out), "input must be 784 little-endian float32") {
		t.Fatalf("100 bytes to the CNN: %d %s %v; want 422 invalid_input with its message", code, out, err)
	}
	// Its declared tensors take FP32 over /v2.
	v2 := fmt.Sprintf(`{"inputs":[{"name":"digit","datatype":"FP32","shape":[1,784],"data":%s}]}`, floatsJSON(held[0].Image()[:]))
	resp, err := http.Post(srv.url+"/v2/models/cnn/infer", "application/json", strings.NewReader(v2))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"name":"scores"`) || !strings.Contains(string(b), `"shape":[1,10]`) {
		t.Fatalf("FP32 over /v2: %d %s", resp.StatusCode, b)
	}
}

func floatsJSON(fs []float32) string {
	b, _ := json.Marshal(fs)
	return string(b)
}

// cnnReference is the CNN's committed weights, as the Go reference model,
// and its held-out digits.
func cnnReference(t *testing.T) (*model.Params, []digits.Digit) {
	t.Helper()
	root := testkit.Root()
	params, err := model.Load(filepath.Join(root, "samples", "cnn", "weights.bin"))
	if err != nil {
		t.Fatal(err)
	}
	held, err := digits.ReadFile(filepath.Join(root, "samples", "cnn", "testdata", "heldout.bin"))
	if err != nil {
		t.Fatal(err)
	}
	return params, held
}
