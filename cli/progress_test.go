package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/plover-run/plover/abi"
	"github.com/plover-run/plover/bundle"
	"github.com/plover-run/plover/objectstore"
	"github.com/plover-run/plover/registry"
)

// terminalBody is what plover deploy uploads from a terminal: a bundle
// past progressThreshold behind the progress bar.
func terminalBody(t *testing.T) ([]byte, io.ReadSeeker, *bytes.Buffer) {
	t.Helper()
	b := make([]byte, progressThreshold+1234)
	rand.Read(b)
	var errb bytes.Buffer
	body, done := withProgress(bytes.NewReader(b), int64(len(b)), "uploading f", &Env{Stderr: &errb, StderrIsTerminal: true})
	t.Cleanup(done)
	if _, ok := body.(*progressBody); !ok {
		t.Fatalf("body is %T, want the progress bar's", body)
	}
	return b, body, &errb
}

// The progress body reads as the bytes it wraps, again after a seek back,
// and draws the bar, which a seek back takes back.
func TestProgressBodySeeksBack(t *testing.T) {
	b, body, errb := terminalBody(t)
	for round := range 2 {
		if _, err := body.Seek(0, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(body)
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("round %d: read %d bytes (%v), want the %d of the bundle", round, len(got), err, len(b))
		}
	}
	// A retry's seek back takes the bar back once reading starts again.
	if _, err := body.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(body, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if got := body.(*progressBody).bar.State().CurrentNum; got != 1<<20 {
		t.Errorf("bar at %v bytes after a seek back and 1 MiB read, want %d", got, 1<<20)
	}
	if !strings.Contains(errb.String(), "uploading f") {
		t.Errorf("no progress bar drawn: %q", errb.String())
	}
}

// vanishingStore deletes the bundle once the publish has written its
// record: a gc that read the records before the record landed.
type vanishingStore struct {
	objectstore.Store
	once sync.Once
}

func (s *vanishingStore) PutIf(ctx context.Context, key string, r io.Reader, size int64, ifMatch string) error {
	err := s.Store.PutIf(ctx, key, r, size, ifMatch)
	if err == nil && strings.HasPrefix(key, "functions/") {
		s.once.Do(func() {
			bundles, _ := s.Store.List(ctx, "bundles/")
			for _, o := range bundles {
				s.Store.Delete(ctx, o.Key)
			}
		})
	}
	return err
}

// plover deploy --store from a terminal: a bundle taken while the record
// was written is stored again from the body (registry's ensureBundle), as
// from a file. Behind progressbar.Reader, which could not seek, the deploy
// failed "the record is written but its bundle ... is missing" and left
// the record naming a missing object.
func TestDeployFromTerminalStoresATakenBundleAgain(t *testing.T) {
	fs, err := objectstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	g := registry.Registry{Store: &vanishingStore{Store: fs}}
	b, body, _ := terminalBody(t)
	sha := bundle.Digest(b)
	ctx := context.Background()
	if _, _, err := g.Publish(ctx, &abi.Manifest{Name: "f", Priority: "default"}, body, sha, int64(len(b)), false); err != nil {
		t.Fatalf("publish: %v", err)
	}
	in, err := fs.Stat(ctx, bundle.ObjectKey(sha))
	if err != nil || in.Size != int64(len(b)) {
		t.Fatalf("bundle after the publish: %+v, %v; want it there, %d bytes", in, err, len(b))
	}
}

// plover deploy --store s3://... from a terminal: S3 answering the PUT
// 503 SlowDown once is retried, as minio-go retries a body it can rewind.
// Behind progressbar.Reader one PUT was sent and the deploy failed.
func TestDeployFromTerminalRetriesASlowDown(t *testing.T) {
	for _, k := range []string{"PLOVER_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} {
		t.Setenv(k, "")
	}
	var mu sync.Mutex
	puts := 0
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // the whole body, so that the answer is read, not a reset
		if r.Method != http.MethodPut {
			w.WriteHeader(http.StatusOK) // the open's HEAD on the bucket
			return
		}
		mu.Lock()
		puts++
		first := puts == 1
		mu.Unlock()
		if first {
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>`))
			return
		}
		w.Header().Set("ETag", `"0123"`)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(ts.Close)
	s, err := objectstore.NewS3(context.Background(), "bkt", "", objectstore.S3Options{Endpoint: ts.URL, Region: "us-east-1", AccessKey: "a", SecretKey: "s"})
	if err != nil {
		t.Fatal(err)
	}
	b, body, _ := terminalBody(t)
	if err := s.Put(context.Background(), bundle.ObjectKey(bundle.Digest(b)), body, int64(len(b))); err != nil {
		t.Fatalf("put: %v (%d PUTs sent)", err, puts)
	}
	if puts != 2 {
		t.Errorf("%d PUTs sent, want 2 (the 503, then its retry)", puts)
	}
}
