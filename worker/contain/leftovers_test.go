package contain

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A server killed and not yet reaped (a zombie: its supervisor reaps
// late) keeps its /proc entry and its start time: EndLeftovers took it for
// running, so the next server left what it had started running and wrote
// its own record over the dead one's tag, which then nothing could find.
func TestEndLeftoversOfAZombieServer(t *testing.T) {
	t.Parallel()
	c := exec.Command("/bin/true")
	if err := c.Start(); err != nil {
		t.Skip(err)
	}
	defer c.Wait()
	pid := c.Process.Pid
	for end := time.Now().Add(childTimeout); !zombie(pid); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("child %d did not exit", pid)
		}
	}
	_, start, ok := statOf(pid)
	if !ok {
		t.Fatalf("the zombie %d has no stat", pid)
	}
	record := filepath.Join(t.TempDir(), "server.pid")
	if err := os.WriteFile(record, fmt.Appendf(nil, "%d %d %s\n", pid, start, strings.Repeat("ef", 16)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := EndLeftovers(record); err != nil {
		t.Fatalf("the record of a dead server not yet reaped: %v, want its leftovers ended", err)
	}
}
