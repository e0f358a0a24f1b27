package minio

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// MinIO must listen on loopback only, console included.
func TestListensOnLoopbackOnly(t *testing.T) {
	s := Start(t)
	s.mu.Lock()
	pid := s.cmd.Process.Pid
	s.mu.Unlock()
	inodes := socketInodes(t, pid)
	var listening []string
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(file)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fld := strings.Fields(sc.Text())
			if len(fld) < 10 || fld[3] != "0A" || !inodes[fld[9]] { // 0A: LISTEN
				continue
			}
			listening = append(listening, fld[1])
		}
		f.Close()
	}
	if len(listening) == 0 {
		t.Fatal("found no listening socket of the MinIO process")
	}
	for _, a := range listening {
		host := a[:strings.IndexByte(a, ':')]
		// 127.x.x.x is 7F in the low byte of the little-endian IPv4 word;
		// ::1 is 0...0 01000000 in /proc's word order.
		if !(len(host) == 8 && strings.HasSuffix(host, "7F")) && host != "00000000000000000000000001000000" {
			t.Errorf("MinIO listens on %s, not loopback", a)
		}
	}
	t.Logf("listening sockets: %v", listening)
}

func socketInodes(t *testing.T, pid int) map[string]bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Skipf("cannot inspect MinIO's sockets: %v", err)
	}
	out := map[string]bool{}
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			out[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	return out
}
