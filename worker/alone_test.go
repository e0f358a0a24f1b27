package worker

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/plover-run/plover/device"
	"github.com/plover-run/plover/internal/testkit"
)

// uniqueSource is a bundle whose answer is a C++ inline function's static,
// the pattern of a header library's singleton or a lazily loaded model:
// g++ makes it a GNU unique symbol, which the dynamic linker binds once a
// process, whatever library asks.
func uniqueSource(t *testing.T, value int) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "unique.cu")
	body := `#include <stdint.h>
#include <string.h>
#include "plover.h"
PLOVER_BUNDLE("host");
struct Model { int32_t value = ` + strconv.Itoa(value) + `; };
inline Model &model() { static Model m; return m; }
PLOVER_ENTRY(echo) {
  (void)grid; (void)block;
  int32_t v = model().value;
  memcpy(s->out.dat, &v, sizeof v);
  s->out.len = sizeof v;
}
`
	if err := os.WriteFile(src, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return src
}

// TestTenantWorkerKeepsGNUUniqueBundlesApart: in tenant scope, a bundle
// defining GNU unique symbols runs in a worker of its own, so that two of
// one tenant's (two functions, or two versions of one under one name)
// each answer from their own object; bundles without them still share
// the tenant's worker.
func TestTenantWorkerKeepsGNUUniqueBundlesApart(t *testing.T) {
	d := tenantDevice(t)
	answer := func(p device.Program, name string) int32 {
		t.Helper()
		m := testkit.Manifest(name)
		out := make([]byte, m.OutBytes)
		r := &device.Run{Output: out, Chain: []device.Step{{Entry: 0, Grid: 1, Block: 1}}, Deadline: time.Now().Add(10 * time.Second)}
		if err := newInst(t, p, m).Run(r); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return int32(binary.LittleEndian.Uint32(out))
	}
	plain := loadFor(t, d, "t", "", testkit.Manifest("plain"), nil)
	other := loadFor(t, d, "t", "", testkit.Manifest("other"), nil)
	progs := map[string]device.Program{}
	for _, v := range []struct {
		name  string
		value int
	}{{"one", 1}, {"two", 2}, {"two", 3}} { // the last: a new version of "two"
		p := loadFor(t, d, "t", uniqueSource(t, v.value), testkit.Manifest(v.name), nil)
		if got := answer(p, v.name); got != int32(v.value) {
			t.Errorf("%s built with %d answers %d: it runs on another bundle's object", v.name, v.value, got)
		}
		progs[v.name+strconv.Itoa(v.value)] = p
	}
	pid := func(p device.Program) int { return p.(*program).PID() }
	if pid(plain) != pid(other) {
		t.Errorf("the tenant's plain functions run in two processes (%d, %d), not its one worker", pid(plain), pid(other))
	}
	seen := map[int]string{pid(plain): "the tenant's worker"}
	for k, p := range progs {
		if was, ok := seen[pid(p)]; ok {
			t.Errorf("%s shares process %d with %s", k, pid(p), was)
		}
		seen[pid(p)] = k
	}
}
