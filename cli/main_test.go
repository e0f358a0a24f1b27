package cli

import (
	"os"
	"testing"

	"github.com/plover-run/plover/worker"
)

// The test binary is its own worker, as plover is: plover run (runLocal)
// starts "EXE worker ..." when no plover-worker lies beside EXE.
func TestMain(m *testing.M) {
	worker.RunIfWorker()
	os.Exit(m.Run())
}
