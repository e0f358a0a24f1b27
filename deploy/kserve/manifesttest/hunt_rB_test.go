package manifesttest

import (
	"slices"
	"testing"
)

// The pending list allows --repository, --repository-poll and
// --repository-name whether or not cli/serve.go defines them. They are
// defined now, so the allowance only hides a rename or removal: were
// --repository renamed in plover serve, the runtime's
// --repository=/mnt/models (a flag the server would refuse, so the pod
// would crash-loop) would still pass TestRuntimeArgsAreServeFlags. (The
// README's "the --repository flags were being added to plover serve while
// these manifests were written" is stale for the same reason.)
func TestHuntPendingHidesRemovedFlag(t *testing.T) {
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
