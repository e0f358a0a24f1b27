package bench

import (
	"strings"
	"testing"
)

// A run ended by ^C says so in words: the report's first line read
// "stopped by interrupted".
func TestWriteTextInterrupted(t *testing.T) {
	res := &Result{Function: "f", Server: "http://s", Concurrency: 1, Stopped: "interrupted"}
	var b strings.Builder
	if err := res.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "stopped by an interrupt (^C)\n") {
		t.Fatalf("first line: %q", strings.SplitN(out, "\n", 2)[0])
	}
}
