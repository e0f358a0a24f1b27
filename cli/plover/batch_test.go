package main_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/samples/cnn/digits"
	"github.com/plover-run/plover/samples/cnn/model"
)

// cnnBatchBundle builds the CNN sample's batching variant (-DCNN_BATCH=64,
// plover-batch.json) into a bundle directory, as make cnn-batch-host does.
func cnnBatchBundle(t *testing.T) string {
	t.Helper()
	root := testkit.Root()
	dir := t.TempDir()
	testkit.BuildLib(t, filepath.Join(root, "samples", "cnn", "cnn.cu"), dir, "cnn.so", "-DCNN_BATCH=64")
	for src, dst := range map[string]string{"plover-batch.json": "plover.json", "weights.bin": "weights.bin"} {
		b, err := os.ReadFile(filepath.Join(root, "samples", "cnn", src))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, dst), b, 0o644)
	}
	return dir
}

var batchDescRE = regexp.MustCompile(`batch;desc=(\d+)`)

// TestCNNBatchedServed: 64 concurrent requests with distinct held-out digits
// through a real plover serve (worker processes); each gets its own scores,
// equal to the reference forward pass, and runs hold more than one digit.
func TestCNNBatchedServed(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and serves the CNN")
	}
	params, held := cnnReference(t)
	bin := buildPlover(t)
	srv := startServer(t, bin, "--max-instances", "2")
	run(t, bin, []string{"PLOVER_SERVER=" + srv.url}, "deploy", cnnBatchBundle(t))

	// A burst of 64 at once queues behind the two instances, so runs
	// gather several digits; on a loaded machine the requests can come in
	// so spread out that each finds an instance free (seen under make
	// test's load: 3 bursts in a row all alone): up to 10 bursts, each
	// answer checked in every one.
	const bursts = 10
	biggest, sent := 0, 0
	for attempt := 1; attempt <= bursts && biggest < 2; attempt++ {
		biggest = cnnBatchBurst(t, srv.url, params, held)
		sent += cnnBurst
		t.Logf("burst %d: the largest batch held %d digits", attempt, biggest)
	}
	if biggest < 2 {
		t.Fatalf("%d bursts of %d concurrent requests on 2 instances all ran alone", bursts, cnnBurst)
	}
	// The histogram agrees: fewer runs than requests.
	resp, err := http.Get(srv.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`plover_batch_size_count\{function="cnn-batch"\} (\d+)`).FindSubmatch(metrics)
	if m == nil {
		t.Fatalf("no plover_batch_size in /metrics")
	}
	if runs, _ := strconv.Atoi(string(m[1])); runs >= sent || runs < 1 {
		t.Fatalf("%d runs for %d requests", runs, sent)
	}
}

// cnnBurst is how many digits a burst sends at once.
const cnnBurst = 64

// A batched run that crashes its worker fails its requests with
// worker_crashed; the server and the function go on with a new worker.
func TestBatchedCrashContained(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	m := testkit.BatchManifest("bcrash", 4, "")
	m.Chain = append(m.Chain, abi.Launch{Kernel: "bcrash", Grid: 1, Block: 1})
	dir := t.TempDir()
	testkit.BuildLib(t, testkit.BatchSource(), dir, m.Library)
	testkit.WriteManifest(t, dir, m)
	bin := buildPlover(t)
	srv := startServer(t, bin)
	run(t, bin, []string{"PLOVER_SERVER=" + srv.url}, "deploy", dir)
	item := func(v uint32) []byte {
		b := make([]byte, 8)
		binary.LittleEndian.PutUint32(b, v)
		return b
	}
	for _, tt := range []struct {
		value uint32
		code  int
		want  string
	}{
		{1, 200, ""},
		{0xC0DE, 500, "worker_crashed"},
		{2, 200, ""},
	} {
		code, body, err := invokeHTTP(srv.url, "bcrash", item(tt.value))
		if err != nil || code != tt.code || !strings.Contains(string(body), tt.want) {
			t.Fatalf("value %#x: %d %v %s; want %d %q", tt.value, code, err, body, tt.code, tt.want)
		}
		if code == 200 && binary.LittleEndian.Uint32(body) != tt.value+1 {
			t.Fatalf("value %d: answer %d", tt.value, binary.LittleEndian.Uint32(body))
		}
	}
}

// cnnBatchBurst sends 64 distinct held-out digits at once to cnn-batch at
// url, checks each answer against the reference, and returns the largest
// batch a run held.
func cnnBatchBurst(t *testing.T, url string, params *model.Params, held []digits.Digit) int {
	t.Helper()
	const n = cnnBurst
	type answer struct {
		digit int
		code  int
		body  []byte
		batch int
		err   error
	}
	answers := make(chan answer, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			d := &held[i]
			resp, err := http.Post(url+"/v1/functions/cnn-batch/invoke", "application/octet-stream", bytes.NewReader(d.Input()))
			if err != nil {
				answers <- answer{digit: i, err: err}
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			a := answer{digit: i, code: resp.StatusCode, body: b, err: err}
			if m := batchDescRE.FindStringSubmatch(resp.Header.Get("Server-Timing")); m != nil {
				a.batch, _ = strconv.Atoi(m[1])
			}
			answers <- a
		}()
	}
	close(start)
	wg.Wait()
	close(answers)
	worst, biggest := 0.0, 0
	for a := range answers {
		if a.err != nil || a.code != 200 {
			t.Fatalf("digit %d: %d %v %s", a.digit, a.code, a.err, a.body)
		}
		got, err := model.DecodeScores(a.body)
		if err != nil {
			t.Fatalf("digit %d: %v", a.digit, err)
		}
		want := params.Scores(held[a.digit].Image())
		for c := range got {
			worst = max(worst, math.Abs(float64(got[c]-want[c])))
		}
		if worst > 1e-5 {
			t.Fatalf("digit %d: scores %v, reference %v (another digit's answer?)", a.digit, got, want)
		}
		if a.batch < 1 {
			t.Fatalf("digit %d: no batch size in Server-Timing", a.digit)
		}
		biggest = max(biggest, a.batch)
	}
	t.Logf("%d concurrent digits: largest batch %d, largest score difference from the reference %.2g", n, biggest, worst)
	return biggest
}
