package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/plover-run/plover/api"
	"github.com/plover-run/plover/frontdoor"
	"github.com/plover-run/plover/funclog"
	"github.com/plover-run/plover/httpapi"
	"github.com/plover-run/plover/internal/testkit"
)

// burstAdmin is logAdmin whose function prints a burst of lines into each
// new follower's backlog before the stream starts reading it (and, with
// deleted, is deleted then): the follower falls behind for certain.
type burstAdmin struct {
	logAdmin
	burst   int
	deleted bool
}

func (a burstAdmin) Logs(ctx context.Context, name string, since time.Time, follow bool) ([]api.LogLine, *funclog.Follower, error) {
	lines, f, err := a.logAdmin.Logs(ctx, name, since, follow)
	if f != nil {
		for i := 1; i <= a.burst; i++ {
			a.store.Sink(name).Add(logLine(fmt.Sprint("line ", i)))
		}
		if a.deleted {
			a.store.Forget(name)
		}
	}
	return lines, f, err
}

// A followed stream that fell behind in a burst tells its client how many
// lines it missed, and carries the burst's last line, though the function
// then prints nothing more (it went quiet, crashed) or is deleted: the
// count comes as the Dropped of that last line, which plover logs and the
// console already show as "... N lines not shown". Before, the count rode
// on the next line to find room, and none came: the client read 256 lines
// of 300 and was told nothing of the others, the burst's last.
func TestLogsFollowTellsWhatItMissedAfterABurst(t *testing.T) {
	defer httpapi.SetFollowTimes(30*time.Second, time.Hour)() // no keep-alive lines
	for _, deleted := range []bool{false, true} {
		t.Run(fmt.Sprint("deleted=", deleted), func(t *testing.T) {
			const burst = 300
			adm := burstAdmin{logAdmin{store: funclog.New(nil), followers: make(chan *funclog.Follower, 1)}, burst, deleted}
			srv := httpapi.New(frontdoor.New(frontdoor.Config{}), adm, httpapi.Options{})
			url := testkit.ServeWith(t, srv) + "/v1/functions/f/logs?follow=true"
			resp, err := (&http.Client{Timeout: 30 * time.Second}).Get(url)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("follow: %v %v", resp, err)
			}
			defer resp.Body.Close()
			got := make(chan api.LogLine, burst)
			go func() {
				defer close(got)
				sc := bufio.NewScanner(resp.Body)
				for sc.Scan() {
					var l api.LogLine
					if json.Unmarshal(sc.Bytes(), &l) == nil {
						got <- l
					}
				}
			}()
			read, told := 0, int64(0)
			timeout := time.After(10 * time.Second)
			for read+int(told) < burst {
				select {
				case l, open := <-got:
					if !open {
						t.Fatalf("the stream ended having carried %d lines and told of %d missed, of %d printed", read, told, burst)
					}
					read++
					told += l.Dropped
					if read+int(told) == burst && l.Line != fmt.Sprint("line ", burst) {
						t.Fatalf("the stream's last line is %q, want the burst's last, line %d", l.Line, burst)
					}
				case <-timeout:
					t.Fatalf("after 10 s the stream had carried %d lines and told of %d missed, of %d printed", read, told, burst)
				}
			}
			if told == 0 {
				t.Fatalf("the follower missed no line of %d: the test's burst no longer overflows its backlog", burst)
			}
			if deleted {
				if l, open := <-got; open {
					t.Fatalf("after the burst of a deleted function the stream carried %+v, want its end", l)
				}
			}
		})
	}
}
