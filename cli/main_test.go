package cli

import (
	"os"
	"testing"

	"github.com/plover-run/plover/worker/inside"
)

// The test binary is its own worker, as plover is: plover run (runLocal)
// starts "EXE worker ..." when no plover-worker lies beside EXE.
func TestMain(m *testing.M) {
	inside.RunIfWorker()
	os.Exit(m.Run())
}
