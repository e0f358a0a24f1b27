package bundle

import (
	"os"
	"path/filepath"
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
			if err := writeSums(dir); err != nil {
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
	if err := writeSums(dir); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := checkSums(dir); err != nil {
			b.Fatal(err)
		}
	}
}
