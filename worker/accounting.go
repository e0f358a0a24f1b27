package worker

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/plover-run/plover/device"
)

// A worker's figures (resident memory, threads, PSS) are read from /proc in
// the background, by the device's watch loop, and reported from there.
// Read when asked, they cost each listing of 1,000 functions with 200 live
// workers about 10 ms of CPU in status files and, once a second, some 50 ms
// more in smaps_rollup, in the request (engine's BenchmarkListMany, 2-core
// VM). A listing, a function's view and /metrics report the same samples.
//
// Sampling follows demand: a worker whose figures were read since its last
// sample is sampled again once that sample is a period old, one nobody
// reads only once it is an idle period old, so that a node nobody watches
// spends little on it. With 200 workers on a 2-core VM that is about 3 ms
// of CPU a second while nothing reads them, 10-15 ms while something lists
// them every second (BenchmarkListMany/unread and apart). A read is
// answered from the last sample: at most a period plus the time since the
// previous read old, never more than an idle period.
const (
	// watchEvery is how often the watch loop looks at the workers:
	// those with a memory limit have their resident memory checked
	// against it each time.
	watchEvery = 100 * time.Millisecond
	// statsEvery and statsIdle are the periods of a worker's resident
	// memory and threads (/proc/PID/status: 10-50 µs a read).
	statsEvery, statsIdle = time.Second, 10 * time.Second
	// pssEvery and pssIdle are its PSS's, dearer to read: smaps_rollup
	// walks the process's page tables (0.1-0.6 ms a host worker, more with
	// a larger address space). A worker's growth shows first in its
	// resident memory.
	pssEvery, pssIdle = 10 * time.Second, time.Minute
)

// sampling is the periods of workers' figures (see statsEvery).
type sampling struct{ statsEvery, statsIdle, pssEvery, pssIdle time.Duration }

// sample is a worker's figures as last read; replaced whole, never
// modified, so that a reader sees one read's figures together.
type sample struct {
	rss, pss  int64 // bytes; pss 0: unreadable (a server not root)
	shmem     int64 // of rss, shared memory (the server's slots are)
	threads   int
	at, pssAt time.Time
	read      time.Time // when it was read: at, unless dated back (measure)
}

// procStatus reads a process's resident memory, of it the shared memory,
// and its thread count from /proc/PID/status. ok is false once the
// process is gone.
func procStatus(pid int) (rss, shmem int64, threads int, ok bool) {
	var kb [3]int64
	if !procFields("/proc/"+strconv.Itoa(pid)+"/status", []string{"VmRSS", "RssShmem", "Threads"}, kb[:]) {
		return 0, 0, 0, false
	}
	return kb[0] << 10, kb[1] << 10, int(kb[2]), true
}

// procPSS reads a process's proportional set size, in bytes, from
// /proc/PID/smaps_rollup (Linux 4.14): 0 where it cannot be read.
func procPSS(pid int) int64 {
	var kb [1]int64
	procFields("/proc/"+strconv.Itoa(pid)+"/smaps_rollup", []string{"Pss"}, kb[:])
	return kb[0] << 10
}

// procFields reads the first number of each "Key: n ..." line of a /proc
// file named in keys into the same place of out; false if it cannot be read.
// It reads with plain system calls into one buffer: os.ReadFile's stat,
// poller registration and growing buffer made a read 3-4 times dearer.
func procFields(path string, keys []string, out []int64) bool {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	var buf [4096]byte // status is about 1.5 KiB, smaps_rollup 1 KiB
	n := 0
	for n < len(buf) {
		m, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			unix.Close(fd)
			return false
		}
		if m == 0 {
			break
		}
		n += m
	}
	unix.Close(fd)
	for rest := buf[:n]; len(rest) > 0; {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte("\n"))
		k, v, found := bytes.Cut(line, []byte(":"))
		if !found {
			continue
		}
		for i, key := range keys { // string(k) == key does not allocate
			if string(k) != key {
				continue
			}
			if fields := bytes.Fields(v); len(fields) > 0 {
				if n, err := strconv.ParseInt(string(fields[0]), 10, 64); err == nil {
					out[i] = n
				}
			}
		}
	}
	return true
}

// Process reports the worker's pid and its last sampled resident memory,
// threads and PSS (see statsEvery), and asks for the next sample. A
// tenant's worker's are the process's, the same for each of its programs:
// Programs says how many share them.
func (g *program) Process() device.ProcessStats {
	st := device.ProcessStats{PID: g.p.pid}
	if !g.p.alive() {
		return st
	}
	st.Programs = 1
	if t := g.p.tenant; t != nil {
		g.p.mu.Lock()
		st.Programs = len(t.progs)
		g.p.mu.Unlock()
	}
	g.p.asked.Store(true)
	s := g.p.sample.Load()
	if s == nil {
		// Loaded since the watch loop last went round: read it now, once.
		s, _ = g.p.measure(nil, true)
		if !g.p.sample.CompareAndSwap(nil, s) {
			s = g.p.sample.Load()
		}
	}
	st.RSSBytes, st.Threads, st.PSSBytes = s.rss, s.threads, s.pss
	return st
}

// measure reads the worker's figures: resident memory and threads, and
// PSS too with pss (else prev's is kept). ok is false if the process is
// gone: its figures are then prev's (zero without one), and Process
// reports it gone anyway.
func (p *proc) measure(prev *sample, pss bool) (s *sample, ok bool) {
	now := time.Now()
	s = &sample{at: now, pssAt: now, read: now}
	if prev != nil {
		s.pss, s.pssAt = prev.pss, prev.pssAt
	} else {
		// The first sample is dated back by a random part of each period,
		// so that workers loaded together (a burst of cold starts) are
		// read again over a period's ticks, not all in one.
		s.at = now.Add(-rand.N(p.d.opts.sampling.statsIdle))
		s.pssAt = now.Add(-rand.N(p.d.opts.sampling.pssIdle))
	}
	if s.rss, s.shmem, s.threads, ok = procStatus(p.pid); !ok && prev != nil {
		s.rss, s.shmem, s.threads = prev.rss, prev.shmem, prev.threads
	}
	if pss {
		s.pss = procPSS(p.pid)
		if prev != nil {
			s.pssAt = now
		}
	}
	return s, ok
}

// watch samples the figures of workers that run a program (what
// Process reports) and kills workers whose resident memory passes their
// limit, until the device closes. A bundle can allocate faster than any
// poll, so the limit bounds what a worker keeps, not a spike; the kill
// reason reaches the requests it was running. No lock is held while /proc
// is read. Once a second it gives back idle pool slots too (sweepSlots),
// their workers' calls left to the background: a slow worker must not
// hold up the memory checks.
func (d *Device) watch() {
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	var watched []*proc
	for tick := 1; ; tick++ {
		select {
		case <-d.stop:
			return
		case <-t.C:
		}
		watched = watched[:0]
		d.mu.Lock()
		for p := range d.procs {
			// Standby workers are in no listing: nothing to sample.
			if p.memLimit.Load() > 0 || p.reported.Load() {
				watched = append(watched, p)
			}
		}
		d.mu.Unlock()
		now, sp := time.Now(), d.opts.sampling
		for _, p := range watched {
			if tick%chargeEvery == 0 {
				p.look(false)
				p.watchMemGroup()
			}
			limit, reported := p.memLimit.Load(), p.reported.Load()
			prev := p.sample.Load()
			status, pss := limit > 0, false
			if reported {
				asked := p.asked.Load()
				due := func(at time.Time, every, idle time.Duration) bool {
					age := now.Sub(at)
					return age >= idle || asked && age >= every
				}
				status = status || prev == nil || due(prev.at, sp.statsEvery, sp.statsIdle)
				pss = prev == nil || due(prev.pssAt, sp.pssEvery, sp.pssIdle)
				if asked && (status || pss) {
					p.asked.Store(false) // a read from now on asks for the next
				}
			}
			if !status && !pss {
				continue
			}
			s, ok := p.measure(prev, pss)
			if reported {
				// A lost swap is to Process measuring a new worker: its
				// sample is as fresh as this one.
				p.sample.CompareAndSwap(prev, s)
			}
			// The server's slots it maps are the server's layout, not the
			// bundle's keeping: on CUDA they are pinned whole (pin.go).
			if rss := p.limitedRSS(s.rss, s.shmem, s.read); ok && limit > 0 && rss > limit {
				p.kill(fmt.Sprintf("its resident memory, %d MiB besides the server's slots, passed its limit of %d MiB (max_host_memory_mb)", rss>>20, limit>>20))
			}
		}
		clear(watched) // no proc kept alive past its tick
		if tick%sweepTicks == 0 {
			d.sweepSlots(time.Now())
		}
	}
}
