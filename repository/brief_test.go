package repository

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A manifest's values are quoted in its reason: a plover.json within its
// 1 MiB bound whose name, target or unknown field is most of that made a
// reason of as much, in every index answer (and a load's error, and the
// log twice at each change). A reason keeps its beginning, which names
// the folder, the file and the field, and says how much was cut.
func TestLongReasonsAreCut(t *testing.T) {
	models := filepath.Join(t.TempDir(), "models")
	for name, man := range map[string]string{
		"longname":    `{"name": "` + strings.Repeat("A", 1<<20-20) + `"}`,
		"longtarget":  `{"name": "longtarget", "abi": 2, "target": "` + strings.Repeat("é", 1<<19-40) + `"}`,
		"unknownlong": `{"` + strings.Repeat("k", 1<<19) + `": 1}`,
	} {
		if err := os.MkdirAll(filepath.Join(models, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(models, name, "plover.json"), []byte(man), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	age(t, models)
	r, _ := New(Config{Dir: models, Settle: 10 * time.Millisecond}, newFakeNode())
	r.Scan(context.Background())
	idx := r.Index(context.Background(), false)
	if len(idx) != 3 {
		t.Fatalf("index: %s", index(r))
	}
	for _, e := range idx {
		if len(e.Reason) > maxReason+40 || !strings.HasPrefix(e.Reason, "models/"+e.Name+": ") ||
			!strings.Contains(e.Reason, "plover.json") || !strings.HasSuffix(e.Reason, " more bytes cut]") || !utf8Valid(e.Reason) {
			t.Errorf("%s: reason of %d bytes: %.160q...%q", e.Name, len(e.Reason), e.Reason, e.Reason[max(0, len(e.Reason)-40):])
		}
	}
	if err := r.Load(context.Background(), "longname"); err == nil || len(err.Error()) > maxReason+80 {
		t.Errorf("load: an error of %d bytes", len(err.Error()))
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }
