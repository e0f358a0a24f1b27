package manifesttest

import (
	"slices"
	"testing"
)

// A flag plover serve defines is not pending: the pending allowance would
// only hide its rename or removal. Were --repository renamed in plover
// serve, the runtime's --repository=/mnt/models (a flag the server would
// refuse, so the pod would crash-loop) must fail
// TestRuntimeArgsAreServeFlags.
func TestRuntimeArgsCatchARemovedFlag(t *testing.T) {
	known := serveFlags(t)
	for _, p := range pending {
		if known[p] {
			t.Errorf("--%s is defined in cli/serve.go yet still pending: a rename of it would go unnoticed", p)
		}
	}
	without := map[string]bool{}
	for k := range known {
		if k != "repository" {
			without[k] = true
		}
	}
	if bad := unknownFlags([]string{"--repository=/mnt/models"}, without); !slices.Equal(bad, []string{"--repository"}) {
		t.Errorf("with --repository gone from plover serve, the runtime's --repository=/mnt/models passes the check (unknown: %q)", bad)
	}
}
