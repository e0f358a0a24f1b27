package testkit

import "path/filepath"

// HostileSource is the source of the hostile kernels for the isolation tests:
// echo (well-behaved), segv, abort_now, exit_zero, sigterm_self,
// overflow_out, spin, sleep_long, close_fds, fork_accept, threads, daemonize, env,
// read_file, memscan, signal_pid, connect_tcp, poke, whoami and hog_memory.
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
