// Package minio runs a real MinIO server on loopback for tests of the S3
// object store: it builds a pinned MinIO release once into a cache directory,
// then starts throwaway servers with their own data directory and root
// credentials.
package minio

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/plover-run/plover/internal/forkthread"
)

// Release is the pinned MinIO release; ModuleVersion is the Go module version
// the proxy resolves its tag to. go install is given the pseudo-version, not
// the tag, so the build does not depend on the proxy answering a tag query.
//
// Later tags were tried: RELEASE.2025-10-15T17-29-55Z (the last published
// release) is refused by proxy.golang.org (403 "not available").
const (
	Release       = "RELEASE.2025-09-07T16-13-09Z"
	ModuleVersion = "v0.0.0-20250907161309-07c3a429bfed"
	modulePath    = "github.com/minio/minio"
)

// InstallTimeout bounds a first build of MinIO (5 minutes or more on two
// cores, 5.3 on a loaded machine).
const InstallTimeout = 20 * time.Minute

// CacheDir is where the pinned binary lives: $PLOVER_MINIO_CACHE/minio-<release>
// or <user cache dir>/plover/minio-<release>.
func CacheDir() (string, error) {
	base := os.Getenv("PLOVER_MINIO_CACHE")
	if base == "" {
		c, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("minio cache: %w (set PLOVER_MINIO_CACHE)", err)
		}
		base = filepath.Join(c, "plover")
	}
	return filepath.Join(base, "minio-"+Release), nil
}

// Install returns the path of the pinned MinIO binary, building it with
// `go install` the first time. PLOVER_MINIO_BIN, if set, names a binary to use
// instead. Build output goes to progress (may be nil). Concurrent callers,
// including other test processes, wait for one build.
func Install(ctx context.Context, progress io.Writer) (string, error) {
	if bin := os.Getenv("PLOVER_MINIO_BIN"); bin != "" {
		if err := checkBinary(ctx, bin); err != nil {
			return "", fmt.Errorf("PLOVER_MINIO_BIN: %w", err)
		}
		return bin, nil
	}
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "minio")
	if checkBinary(ctx, bin) == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("minio cache: %w", err)
	}
	unlock, err := lockFile(ctx, filepath.Join(dir, ".lock"))
	if err != nil {
		return "", fmt.Errorf("minio cache: %w", err)
	}
	defer unlock()
	// Another process may have built it while this one waited for the lock.
	if checkBinary(ctx, bin) == nil {
		return bin, nil
	}
	ctx, cancel := context.WithTimeout(ctx, InstallTimeout)
	defer cancel()
	// Build into a scratch GOBIN and rename, so that a killed build never
	// leaves a half-written binary at the cached path. Scratch directories
	// present now, under the lock, are from builds that were killed.
	if old, _ := filepath.Glob(filepath.Join(dir, ".build-*")); len(old) > 0 {
		for _, o := range old {
			os.RemoveAll(o)
		}
	}
	tmp, err := os.MkdirTemp(dir, ".build-*")
	if err != nil {
		return "", fmt.Errorf("minio cache: %w", err)
	}
	defer os.RemoveAll(tmp)
	goBin, err := goTool()
	if err != nil {
		return "", err
	}
	if progress != nil {
		// go install is silent while it compiles, which takes minutes.
		fmt.Fprintf(progress, "minio: building MinIO %s (%s@%s) into %s; this takes several minutes, once (`go run ./internal/minio/cmd/install-minio` does it up front)\n", Release, modulePath, ModuleVersion, dir)
	}
	cmd := exec.CommandContext(ctx, goBin, "install", modulePath+"@"+ModuleVersion)
	// Outside any module, with no inherited GOFLAGS (e.g. -mod=vendor) or
	// workspace, so the build is the same wherever it runs. MinIO's releases
	// are built without cgo, which also spares a C toolchain.
	cmd.Dir = tmp
	// A test binary that hits its -timeout mid-build exits without running
	// deferred cleanups; the build must not outlive it.
	cmd.SysProcAttr = sysProcAttr()
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=", "GOWORK=off", "CGO_ENABLED=0")
	var out bytes.Buffer
	if progress != nil {
		cmd.Stdout = io.MultiWriter(&out, progress)
		cmd.Stderr = io.MultiWriter(&out, progress)
	} else {
		cmd.Stdout, cmd.Stderr = &out, &out
	}
	// Started from forkthread's thread, as the server is: its death
	// signal follows the thread that forked it, which a test's closed
	// Spawner may end mid-build.
	err = forkthread.Start(cmd)
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (gave up after %v)", ctx.Err(), InstallTimeout)
		}
		return "", fmt.Errorf("go install %s@%s: %w\n%s", modulePath, ModuleVersion, err, tail(out.String(), 4000))
	}
	if err := os.Rename(filepath.Join(tmp, "minio"), bin); err != nil {
		return "", fmt.Errorf("minio cache: %w", err)
	}
	if err := checkBinary(ctx, bin); err != nil {
		return "", err
	}
	return bin, nil
}

func goTool() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	if root := os.Getenv("GOROOT"); root != "" {
		p := filepath.Join(root, "bin", "go")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("cannot build MinIO: no go command on PATH")
}

// checkBinary runs `minio --version` so that a truncated or foreign file at
// the cached path is rebuilt rather than trusted.
func checkBinary(ctx context.Context, bin string) error {
	if _, err := os.Stat(bin); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s --version: %w: %s", bin, err, tail(string(out), 500))
	}
	return nil
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
