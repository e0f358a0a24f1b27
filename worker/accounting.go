package worker

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/plover-run/plover/device"
)

// procStatus reads a process's resident memory and thread count from
// /proc/PID/status. ok is false once the process is gone.
func procStatus(pid int) (rss int64, threads int, ok bool) {
	var kb [2]int64
	if !procFields("/proc/"+strconv.Itoa(pid)+"/status", []string{"VmRSS", "Threads"}, kb[:]) {
		return 0, 0, false
	}
	return kb[0] << 10, int(kb[1]), true
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
func procFields(path string, keys []string, out []int64) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
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

// Process reports the worker's pid, resident memory and threads.
func (g *program) Process() device.ProcessStats {
	st := device.ProcessStats{PID: g.p.pid}
	if g.p.alive() {
		st.RSSBytes, st.Threads, _ = procStatus(g.p.pid)
		st.PSSBytes = g.p.pss()
	}
	return st
}

// memoryWatchEvery is how often workers' resident memory is checked
// against their limits.
const memoryWatchEvery = 100 * time.Millisecond

// watchMemory kills workers whose resident memory passes their limit,
// until the device closes. A bundle can allocate faster than any poll, so
// this bounds what a worker keeps, not a spike; the kill reason reaches the
// requests it was running.
func (d *Device) watchMemory() {
	t := time.NewTicker(memoryWatchEvery)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
		}
		d.mu.Lock()
		var watched []*proc
		for p := range d.procs {
			if p.memLimit.Load() > 0 {
				watched = append(watched, p)
			}
		}
		d.mu.Unlock()
		for _, p := range watched {
			limit := p.memLimit.Load()
			if rss, _, ok := procStatus(p.pid); ok && rss > limit {
				p.kill(fmt.Sprintf("its resident memory, %d MiB, passed its limit of %d MiB (max_host_memory_mb)", rss>>20, limit>>20))
			}
		}
	}
}

// pssEvery bounds how often a worker's PSS is read: smaps_rollup walks the
// process's page tables, and a listing of a thousand functions asks for
// every worker's.
const pssEvery = time.Second

// pss is the worker's proportional set size, read at most every pssEvery.
func (p *proc) pss() int64 {
	now := time.Now().UnixNano()
	if at := p.pssAt.Load(); at != 0 && now-at < int64(pssEvery) {
		return p.pssBytes.Load()
	}
	v := procPSS(p.pid)
	p.pssBytes.Store(v)
	p.pssAt.Store(now)
	return v
}
