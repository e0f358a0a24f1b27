package api_test

import (
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/engine"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
	"github.com/plover-run/plover/worker"
	"github.com/plover-run/plover/worker/contain"
	"github.com/plover-run/plover/worker/inside"
)

// This test binary is its own worker (worker processes run "EXE worker").
func TestMain(m *testing.M) {
	inside.RunIfWorker()
	os.Exit(m.Run())
}

// A function running in a worker process: its info (with the worker's
// pid, memory and threads) matches the spec's FunctionInfo, which refuses
// properties it does not name. TestServerMatchesSpec runs functions in
// process, where there are no workers to describe.
func TestWorkerInfoMatchesSpec(t *testing.T) {
	doc := loadSpec(t)
	spawner := contain.NewSpawner()
	defer spawner.Close()
	dev := worker.NewDevice(worker.Options{Exe: os.Args[0], Base: device.NewHost(0), StageDir: t.TempDir(), Spawner: spawner})
	defer dev.Close()
	e := testkit.Engine(t, engine.Config{Devices: []device.Device{dev}})
	testkit.Deploy(t, e, testkit.BundleDir(t, testkit.Manifest("echo"), nil))
	url := testkit.Serve(t, e, httpapi.Options{Version: "test"})
	resp, err := http.Post(url+"/v1/functions/echo/invoke", "application/octet-stream", strings.NewReader("hi"))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("invoke: %v %v", err, resp)
	}
	resp.Body.Close()
	resp, err = http.Get(url + "/v1/functions/echo")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"workers":[{`) {
		t.Fatalf("no worker in the function's info: %s", b)
	}
	checkJSON(func(format string, args ...any) { t.Errorf(format, args...) }, doc.Components.Schemas["FunctionInfo"].Value, b, "")
}
