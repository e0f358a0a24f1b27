package bundle

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
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
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
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

// BenchmarkCheckSums: the cost of verifying a cached bundle at load, per
// byte (SetBytes: the MB/s column).
func BenchmarkCheckSums(b *testing.B) {
	dir := b.TempDir()
	data := make([]byte, 256<<20)
	for i := range data {
		data[i] = byte(i)
	}
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
