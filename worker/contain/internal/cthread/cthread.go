// Package cthread starts an OS thread from C, unknown to the Go runtime,
// the way a native library (the CUDA driver, a tenant's thread pool)
// does, and opens files on it on request. It exists so that the contain
// tests can check that process-wide restrictions reach such threads.
package cthread

/*
// The Makefile turns deprecation warnings off for go-nvml; ours stay on.
#cgo CFLAGS: -Wdeprecated-declarations
#include <errno.h>
#include <stdlib.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int started, requested, answered, result;
static long thread_tid;
static const char *probe_path;

static void *probe_thread(void *arg) {
	(void)arg;
	pthread_mutex_lock(&mu);
	thread_tid = syscall(SYS_gettid);
	started = 1;
	pthread_cond_broadcast(&cv);
	for (;;) {
		while (requested == answered) {
			pthread_cond_wait(&cv, &mu);
		}
		int fd = open(probe_path, O_RDONLY | O_CLOEXEC);
		result = fd < 0 ? errno : 0;
		if (fd >= 0) {
			close(fd);
		}
		answered++;
		pthread_cond_broadcast(&cv);
	}
	return 0;
}

// cthread_start starts the thread once and returns its tid, or -errno.
static long cthread_start(void) {
	pthread_t t;
	pthread_mutex_lock(&mu);
	if (!started) {
		int err = pthread_create(&t, 0, probe_thread, 0);
		if (err != 0) {
			pthread_mutex_unlock(&mu);
			return -err;
		}
		pthread_detach(t);
		while (!started) {
			pthread_cond_wait(&cv, &mu);
		}
	}
	long tid = thread_tid;
	pthread_mutex_unlock(&mu);
	return tid;
}

// cthread_open opens path read-only on the thread; 0 or an errno.
static int cthread_open(const char *path) {
	pthread_mutex_lock(&mu);
	probe_path = path;
	requested++;
	pthread_cond_broadcast(&cv);
	while (answered != requested) {
		pthread_cond_wait(&cv, &mu);
	}
	int r = result;
	pthread_mutex_unlock(&mu);
	return r;
}
*/
import "C"

import (
	"syscall"
	"unsafe"
)

// Start starts the C thread (once) and returns its thread id.
func Start() (int, error) {
	r := C.cthread_start()
	if r < 0 {
		return 0, syscall.Errno(-r)
	}
	return int(r), nil
}

// Open opens path read-only on the C thread and closes it again.
func Open(path string) error {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	if e := C.cthread_open(cs); e != 0 {
		return syscall.Errno(e)
	}
	return nil
}
