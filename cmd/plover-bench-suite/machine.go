package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
)

// machine identifies where the numbers come from.
type machine struct {
	CPU    string `json:"cpu"`
	Cores  int    `json:"cores"`
	VM     bool   `json:"vm"` // the CPU reports a hypervisor
	MemGiB int64  `json:"mem_gib"`
	OS     string `json:"os"`
	Kernel string `json:"kernel"`
	Go     string `json:"go"` // the toolchain that built this suite
	Plover string `json:"plover"`
}

func readMachine() machine {
	m := machine{CPU: "unknown CPU", Cores: runtime.NumCPU(), Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				continue
			}
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			switch {
			case k == "model name" && m.CPU == "unknown CPU":
				m.CPU = v
			case k == "flags" && strings.Contains(" "+v+" ", " hypervisor "):
				m.VM = true
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if i := bytes.Index(b, []byte("MemTotal:")); i >= 0 {
			fmt.Sscanf(string(b[i+len("MemTotal:"):]), "%d", &kb)
			m.MemGiB = (kb + 1<<19) >> 20
		}
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	var u syscall.Utsname
	if syscall.Uname(&u) == nil {
		var b strings.Builder
		for _, c := range u.Release {
			if c == 0 {
				break
			}
			b.WriteByte(byte(c))
		}
		m.Kernel = b.String()
	}
	return m
}

func (m machine) String() string {
	vm := ""
	if m.VM {
		vm = " (virtual machine)"
	}
	return fmt.Sprintf("%s%s, %d cores, %d GiB, %s, Linux %s; suite built with %s; %s",
		m.CPU, vm, m.Cores, m.MemGiB, m.OS, m.Kernel, m.Go, m.Plover)
}

// loadAvg is the 1, 5 and 15 minute load averages from /proc/loadavg.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " / ")
}
