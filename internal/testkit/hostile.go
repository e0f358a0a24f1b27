package testkit

import (
	"archive/tar"
	"bytes"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
)

// HostileSource is the source of the hostile kernels for the isolation tests:
// echo (well-behaved), segv, abort_now, exit_zero, sigterm_self,
// overflow_out, spin, sleep_long, close_fds, fork_accept, threads, daemonize, new_session, env,
// read_file, memscan, signal_pid, connect_tcp, send_udp, poke, whoami,
// hog_memory, fork_hog, fork_swarm and hide_memory.
// Build it with BuildLib.
func HostileSource() string { return filepath.Join(Root(), "internal", "testkit", "hostile.cu") }

// HooksSource is the ABI 2 hooks test bundle (entry "report"); build it with
// -DFAIL_LOAD or -DFAIL_INIT to make plover_load or plover_instance_init fail.
func HooksSource() string { return filepath.Join(Root(), "internal", "testkit", "hooks.cu") }

// HostileCtorSource is a library whose ELF constructor segfaults when it is
// loaded; it also has a valid PLOVER_BUNDLE and an echo entry, so it passes
// the static checks of a deploy.
func HostileCtorSource() string {
	return filepath.Join(Root(), "internal", "testkit", "hostile_ctor.cu")
}

// RawBundle packs a bundle of the given files in order, each a name and its
// bytes, as Pack lays one out but checking nothing: a bundle a client made
// by hand (a manifest plover deploy would refuse), for the server's own
// checks.
func RawBundle(t testing.TB, files ...[2]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := zstd.NewWriter(&buf)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(zw)
	for _, f := range files {
		hdr := &tar.Header{Name: f[0], Mode: 0o644, Size: int64(len(f[1])), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, f[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
