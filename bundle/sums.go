package bundle

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// sumsFile, in an unpacked bundle directory, lists the SHA-256 of each of
// its files as unpacking wrote them, so that a load from the cache can tell
// a file damaged on disk (or by hand) from the bundle in the store.
const sumsFile = ".plover-sha256"

// writeSums records the digest of every regular file in dir and makes the
// files, the list and the directory durable.
func writeSums(dir string) error {
	des, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var lines []string
	for _, de := range des {
		if !de.Type().IsRegular() || de.Name() == sumsFile {
			continue
		}
		sum, err := fileSum(filepath.Join(dir, de.Name()), true)
		if err != nil {
			return err
		}
		lines = append(lines, sum+"  "+de.Name())
	}
	sort.Strings(lines)
	f, err := os.OpenFile(filepath.Join(dir, sumsFile), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = io.WriteString(f, strings.Join(lines, "\n")+"\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = syncDir(dir)
	}
	return err
}

// checkSums re-hashes every file writeSums listed; an error says which file
// differs (or that the list is missing: a cache entry from before the lists,
// which is simply fetched again).
func checkSums(dir string) error {
	f, err := os.Open(filepath.Join(dir, sumsFile))
	if err != nil {
		return fmt.Errorf("no digest list: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	n := 0
	for sc.Scan() {
		want, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok || strings.ContainsRune(name, '/') {
			return fmt.Errorf("digest list line %q is malformed", sc.Text())
		}
		got, err := fileSum(filepath.Join(dir, name), false)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if got != want {
			return fmt.Errorf("%s hashes to %s, unpacked as %s", name, got, want)
		}
		n++
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("empty digest list")
	}
	return nil
}

// fileSum is a file's SHA-256; sync also makes the file durable.
func fileSum(p string, sync bool) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	if sync {
		if err := f.Sync(); err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
