package bundle

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/plover-run/plover/abi"
)

func TestSumsCatchDamage(t *testing.T) {
	for _, tt := range []struct {
		name   string
		damage func(dir string)
		want   string
	}{
		{"intact", func(string) {}, ""},
		{"flipped byte", func(d string) {
			b, _ := os.ReadFile(filepath.Join(d, "c.bin"))
			b[3] ^= 1
			os.WriteFile(filepath.Join(d, "c.bin"), b, 0o644)
		}, "c.bin hashes to"},
		{"truncated", func(d string) { os.Truncate(filepath.Join(d, "lib.so"), 2) }, "lib.so hashes to"},
		{"removed", func(d string) { os.Remove(filepath.Join(d, "lib.so")) }, "lib.so"},
		{"no list", func(d string) { os.Remove(filepath.Join(d, sumsFile)) }, "no digest list"},
		// A list that lost lines leaves a file unchecked: it must name
		// exactly what the manifest says the bundle holds.
		{"the constants' line lost", dropLine("c.bin"), "digest list does not name c.bin, the bundle's constants"},
		{"the library's line lost", dropLine("lib.so"), "digest list does not name lib.so, the bundle's library"},
		{"plover.json's line lost", dropLine(abi.ManifestFile), "digest list does not name plover.json"},
		{"a file the manifest does not name", func(d string) {
			os.WriteFile(filepath.Join(d, "x.bin"), []byte("x"), 0o644)
			writeSums(d)
		}, "digest list names x.bin, which the bundle's manifest does not"},
		{"a line twice", func(d string) {
			b, _ := os.ReadFile(filepath.Join(d, sumsFile))
			first, _, _ := strings.Cut(string(b), "\n")
			os.WriteFile(filepath.Join(d, sumsFile), append(b, first+"\n"...), 0o644)
		}, "is malformed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, abi.ManifestFile), manifestJSON(t, "c.bin"), 0o644)
			os.WriteFile(filepath.Join(dir, "c.bin"), []byte("constants!"), 0o644)
			os.WriteFile(filepath.Join(dir, "lib.so"), []byte("library bytes"), 0o644)
			if _, err := writeSums(dir); err != nil {
				t.Fatal(err)
			}
			tt.damage(dir)
			_, err := checkSums(dir)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("checkSums = %v, want %q", err, tt.want)
			}
		})
	}
}

// dropLine removes name's line from dir's digest list.
func dropLine(name string) func(dir string) {
	return func(dir string) {
		p := filepath.Join(dir, sumsFile)
		b, _ := os.ReadFile(p)
		var kept []string
		for _, line := range strings.SplitAfter(string(b), "\n") {
			if _, n, _ := sumsLine(strings.TrimSuffix(line, "\n")); n != name {
				kept = append(kept, line)
			}
		}
		os.WriteFile(p, []byte(strings.Join(kept, "")), 0o644)
	}
}

// A cached entry whose digest list lost the constants' line, and whose
// stamps file is gone, has its constants hashed all the same: damaged,
// the entry is fetched again, not stamped as checked and loaded. The
// list's lines alone were checked, and the damaged constants were served.
func TestCacheRepairsConstantsTheListLost(t *testing.T) {
	store, sha, cache := storedBundle(t)
	dir := getReleased(t, cache, store, sha)
	dropLine("w.bin")(dir)
	os.Remove(filepath.Join(dir, stampsFile))
	os.WriteFile(filepath.Join(dir, "w.bin"), []byte("damaged constants"), 0o644)
	var repaired error
	restarted, err := NewCache(filepath.Dir(dir), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	restarted.OnRepair = func(_ string, err error) { repaired = err }
	_, _, fetched, err := restarted.Get(context.Background(), store, sha)
	if err != nil {
		t.Fatal(err)
	}
	restarted.Release(sha)
	if !fetched || repaired == nil || !strings.Contains(repaired.Error(), "does not name w.bin") {
		t.Errorf("fetched %v, repaired because %v; want fetched again because the list does not name w.bin", fetched, repaired)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "w.bin")); !bytes.Equal(b, bytes.Repeat([]byte{7}, 4<<10)) {
		t.Errorf("constants now %.20q, want the bundle's", b)
	}
}

// BenchmarkCheckSums: the cost of verifying a cached bundle at load, per
// byte (SetBytes: the MB/s column).
func BenchmarkCheckSums(b *testing.B) {
	dir := b.TempDir()
	data := make([]byte, 256<<20)
	for i := range data {
		data[i] = byte(i)
	}
	os.WriteFile(filepath.Join(dir, abi.ManifestFile), manifestJSON(b, "weights.bin"), 0o644)
	os.WriteFile(filepath.Join(dir, "lib.so"), []byte("\x7fELF"), 0o644)
	os.WriteFile(filepath.Join(dir, "weights.bin"), data, 0o644)
	if _, err := writeSums(dir); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := checkSums(dir); err != nil {
			b.Fatal(err)
		}
	}
}

// readStamps gives back what write kept, and nothing from a file that is
// not wholly such a list (the entry is then hashed).
func TestReadStamps(t *testing.T) {
	kept := stamps{{name: sumsFile, dev: 2049, ino: 7, size: 120, mtime: 1764000000123456789}, {name: "lib so.so", dev: 2049, ino: 8, size: 48304, mtime: 1}}
	dir := t.TempDir()
	if err := kept.write(dir); err != nil {
		t.Fatal(err)
	}
	if got := readStamps(dir); !slices.Equal(got, kept) {
		t.Fatalf("read %+v, want %+v", got, kept)
	}
	for _, tt := range []struct{ name, text string }{
		{"empty", ""},
		{"the digest list alone", "1 2 3 4 " + sumsFile + "\n"},
		{"no digest list first", "1 2 3 4 lib.so\n1 2 3 4 " + sumsFile + "\n"},
		{"a field missing", "1 2 3 " + sumsFile + "\n1 2 3 4 lib.so\n"},
		{"a negative inode", "1 -2 3 4 " + sumsFile + "\n1 2 3 4 lib.so\n"},
		{"not a number", "1 2 x 4 " + sumsFile + "\n1 2 3 4 lib.so\n"},
		{"a path", "1 2 3 4 " + sumsFile + "\n1 2 3 4 ../lib.so\n"},
		{"no name", "1 2 3 4 " + sumsFile + "\n1 2 3 4 \n"},
		{"a blank line", "1 2 3 4 " + sumsFile + "\n\n1 2 3 4 lib.so\n"},
	} {
		os.WriteFile(filepath.Join(dir, stampsFile), []byte(tt.text), 0o644)
		if got := readStamps(dir); got != nil {
			t.Errorf("%s: read %+v, want nothing", tt.name, got)
		}
	}
}
