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
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, false
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		k, v, found := bytes.Cut(line, []byte(":"))
		if !found {
			continue
		}
		fields := bytes.Fields(v)
		if len(fields) == 0 {
			continue
		}
		n, err := strconv.ParseInt(string(fields[0]), 10, 64)
		if err != nil {
			continue
		}
		switch string(k) {
		case "VmRSS":
			rss = n << 10 // kB
		case "Threads":
			threads = int(n)
		}
	}
	return rss, threads, true
}

// Process reports the worker's pid, resident memory and threads.
func (g *program) Process() device.ProcessStats {
	st := device.ProcessStats{PID: g.p.pid}
	if g.p.alive() {
		st.RSSBytes, st.Threads, _ = procStatus(g.p.pid)
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
