package cli

import (
	"fmt"
	"os"
	"testing"

	"github.com/plover-run/plover/worker"
)

// The test binary is its own worker, as plover is: plover run (runLocal)
// starts "EXE worker ..." when no plover-worker lies beside EXE.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "worker" {
		if err := worker.Main(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
