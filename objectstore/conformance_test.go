package objectstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	miniogo "github.com/minio/minio-go/v7"

	"github.com/plover-run/plover/internal/minio"
)

// backend opens fresh, empty stores for the subtests of one backend.
type backend struct {
	name string
	// setup runs once in the backend's subtest (where an S3 backend starts
	// MinIO, or skips) and returns the opener for its subtests.
	setup func(t *testing.T) (open func(t *testing.T) Store, s3 *s3Fixture)
}

type s3Fixture struct{ srv *minio.Server }

var bucketSeq atomic.Int64

// newBucket creates a bucket with a name unique within the server.
func newBucket(t *testing.T, srv *minio.Server) string {
	t.Helper()
	name := fmt.Sprintf("plover-test-%d", bucketSeq.Add(1))
	srv.MustCreateBucket(t, name)
	return name
}

func s3Options(srv *minio.Server) S3Options {
	return S3Options{Endpoint: srv.Endpoint, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey}
}

// backends are the filesystem store and S3 stores with and without a key
// prefix, each S3 one on its own MinIO server.
func backends() []backend {
	fsb := backend{name: "fs", setup: func(*testing.T) (func(*testing.T) Store, *s3Fixture) {
		return func(t *testing.T) Store {
			s, err := Open(context.Background(), t.TempDir(), S3Options{})
			if err != nil {
				t.Fatal(err)
			}
			return s
		}, nil
	}}
	s3b := func(name, prefix string) backend {
		return backend{name: name, setup: func(t *testing.T) (func(*testing.T) Store, *s3Fixture) {
			srv := minio.Start(t)
			return func(t *testing.T) Store {
				url := "s3://" + newBucket(t, srv)
				if prefix != "" {
					url += "/" + prefix
				}
				s, err := Open(context.Background(), url, s3Options(srv))
				if err != nil {
					t.Fatal(err)
				}
				return s
			}, &s3Fixture{srv}
		}}
	}
	return []backend{fsb, s3b("s3", ""), s3b("s3-prefix", "tenant/a")}
}

func put(t *testing.T, s Store, key string, data []byte) {
	t.Helper()
	if err := s.Put(context.Background(), key, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

func get(t *testing.T, s Store, key string) []byte {
	t.Helper()
	rc, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return b
}

func keys(infos []Info) []string {
	out := []string{}
	for _, in := range infos {
		out = append(out, in.Key)
	}
	return out
}

// onlyReader hides every method but Read, as a progress-bar wrapper does.
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

// countingReader stands in for the CLI's progress hook.
type countingReader struct {
	r io.Reader
	n atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// failingReader yields n bytes, then an error.
type failingReader struct{ n int }

var errBoom = errors.New("boom: reader failed")

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n == 0 {
		return 0, errBoom
	}
	if len(p) > f.n {
		p = p[:f.n]
	}
	for i := range p {
		p[i] = 'x'
	}
	f.n -= len(p)
	return len(p), nil
}

func randomBytes(n int, seed int64) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

func TestConformance(t *testing.T) {
	ctx := context.Background()
	for _, be := range backends() {
		t.Run(be.name, func(t *testing.T) {
			open, s3fx := be.setup(t)
			t.Run("PutGetStat", func(t *testing.T) {
				s := open(t)
				before := time.Now().Add(-time.Minute)
				put(t, s, "a/b.txt", []byte("hello"))
				if got := get(t, s, "a/b.txt"); string(got) != "hello" {
					t.Fatalf("get = %q", got)
				}
				in, err := s.Stat(ctx, "a/b.txt")
				if err != nil {
					t.Fatal(err)
				}
				if in.Key != "a/b.txt" || in.Size != 5 || in.ModTime.Before(before) || in.ModTime.After(time.Now().Add(time.Minute)) {
					t.Fatalf("stat = %+v", in)
				}
			})

			t.Run("Overwrite", func(t *testing.T) {
				s := open(t)
				put(t, s, "k", []byte("first version, longer"))
				put(t, s, "k", []byte("second"))
				if got := get(t, s, "k"); string(got) != "second" {
					t.Fatalf("get = %q", got)
				}
				if in, err := s.Stat(ctx, "k"); err != nil || in.Size != 6 {
					t.Fatalf("stat = %+v, %v", in, err)
				}
				if l, err := s.List(ctx, ""); err != nil || len(l) != 1 {
					t.Fatalf("list = %v, %v", keys(l), err)
				}
			})

			t.Run("NotFound", func(t *testing.T) {
				s := open(t)
				put(t, s, "dir/present", []byte("x"))
				for _, key := range []string{"missing", "dir/missing", "dir"} {
					if _, err := s.Get(ctx, key); !errors.Is(err, ErrNotFound) {
						t.Errorf("get %s: %v, want ErrNotFound", key, err)
					}
					if _, err := s.Stat(ctx, key); !errors.Is(err, ErrNotFound) {
						t.Errorf("stat %s: %v, want ErrNotFound", key, err)
					}
				}
			})

			t.Run("Delete", func(t *testing.T) {
				s := open(t)
				if err := s.Delete(ctx, "never/existed"); err != nil {
					t.Fatalf("delete missing: %v", err)
				}
				put(t, s, "d/x", []byte("x"))
				put(t, s, "d/y", []byte("y"))
				if err := s.Delete(ctx, "d/x"); err != nil {
					t.Fatal(err)
				}
				if _, err := s.Stat(ctx, "d/x"); !errors.Is(err, ErrNotFound) {
					t.Fatalf("stat after delete: %v", err)
				}
				if err := s.Delete(ctx, "d/x"); err != nil {
					t.Fatalf("second delete: %v", err)
				}
				if l, _ := s.List(ctx, ""); strings.Join(keys(l), ",") != "d/y" {
					t.Fatalf("list = %v", keys(l))
				}
			})

			t.Run("List", func(t *testing.T) {
				s := open(t)
				for _, k := range []string{"functions/b.json", "bundles/ff", "functions/a.json", "functionsX", "f/z", "functions/sub/c.json"} {
					put(t, s, k, []byte(k))
				}
				for _, tc := range []struct{ prefix, want string }{
					{"", "bundles/ff,f/z,functions/a.json,functions/b.json,functions/sub/c.json,functionsX"},
					{"functions/", "functions/a.json,functions/b.json,functions/sub/c.json"},
					{"fun", "functions/a.json,functions/b.json,functions/sub/c.json,functionsX"},
					{"functions/sub/", "functions/sub/c.json"},
					{"nope/", ""},
				} {
					l, err := s.List(ctx, tc.prefix)
					if err != nil {
						t.Fatal(err)
					}
					if got := strings.Join(keys(l), ","); got != tc.want {
						t.Errorf("list %q = %s, want %s", tc.prefix, got, tc.want)
					}
					for _, in := range l {
						if in.Size != int64(len(in.Key)) || in.ModTime.IsZero() {
							t.Errorf("list %q: %+v", tc.prefix, in)
						}
					}
				}
			})

			t.Run("InvalidKeys", func(t *testing.T) {
				s := open(t)
				for _, key := range []string{"../x", "a/../../x", "/abs", "a//b", "", "a/", "./a", "a/./b", ".hidden", "a b", "a\\b", strings.Repeat("k", 513)} {
					if err := s.Put(ctx, key, strings.NewReader("x"), 1); err == nil {
						t.Errorf("put %q: no error", key)
					}
					if _, err := s.Get(ctx, key); err == nil || errors.Is(err, ErrNotFound) {
						t.Errorf("get %q: %v, want a key error", key, err)
					}
					if _, err := s.Stat(ctx, key); err == nil || errors.Is(err, ErrNotFound) {
						t.Errorf("stat %q: %v, want a key error", key, err)
					}
					if err := s.Delete(ctx, key); err == nil {
						t.Errorf("delete %q: no error", key)
					}
				}
				if l, err := s.List(ctx, ""); err != nil || len(l) != 0 {
					t.Fatalf("list after invalid puts = %v, %v", keys(l), err)
				}
			})

			t.Run("WrongSize", func(t *testing.T) {
				s := open(t)
				put(t, s, "k", []byte("original"))
				data := []byte("0123456789")
				cases := []struct {
					name string
					r    func() io.Reader
					size int64
				}{
					{"short-seekable", func() io.Reader { return bytes.NewReader(data) }, 20},
					{"long-seekable", func() io.Reader { return bytes.NewReader(data) }, 5},
					{"short-stream", func() io.Reader { return onlyReader{bytes.NewReader(data)} }, 20},
					{"long-stream", func() io.Reader { return onlyReader{bytes.NewReader(data)} }, 5},
				}
				for _, tc := range cases {
					if err := s.Put(ctx, "k", tc.r(), tc.size); err == nil {
						t.Errorf("%s: put succeeded", tc.name)
					}
					if got := get(t, s, "k"); string(got) != "original" {
						t.Fatalf("%s: object now %q", tc.name, got)
					}
				}
			})

			t.Run("UnknownSize", func(t *testing.T) {
				s := open(t)
				data := randomBytes(100<<10, 3)
				if err := s.Put(ctx, "u", onlyReader{bytes.NewReader(data)}, -1); err != nil {
					t.Fatal(err)
				}
				if got := get(t, s, "u"); !bytes.Equal(got, data) {
					t.Fatalf("got %d bytes back", len(got))
				}
			})

			t.Run("Large", func(t *testing.T) {
				s := open(t)
				// Above minio-go's 16 MiB part size, so S3 uploads in parts.
				data := randomBytes(20<<20, 1)
				want := sha256.Sum256(data)
				for _, tc := range []struct {
					name string
					r    io.Reader
				}{
					{"seekable", bytes.NewReader(data)},
					// What the CLI's progress bar does: a plain Reader that counts.
					{"progress-stream", &countingReader{r: onlyReader{bytes.NewReader(data)}}},
				} {
					key := "big/" + tc.name
					if err := s.Put(ctx, key, tc.r, int64(len(data))); err != nil {
						t.Fatalf("%s: %v", tc.name, err)
					}
					if c, ok := tc.r.(*countingReader); ok && c.n.Load() != int64(len(data)) {
						t.Errorf("%s: progress saw %d bytes, want %d", tc.name, c.n.Load(), len(data))
					}
					rc, err := s.Get(ctx, key)
					if err != nil {
						t.Fatal(err)
					}
					h := sha256.New()
					n, err := io.Copy(h, rc)
					rc.Close()
					if err != nil || n != int64(len(data)) || !bytes.Equal(h.Sum(nil), want[:]) {
						t.Fatalf("%s: read back %d bytes (err %v), sha256 match %v", tc.name, n, err, bytes.Equal(h.Sum(nil), want[:]))
					}
					if s3fx != nil {
						assertMultipart(t, s3fx, s.(*S3), key)
					}
				}
			})

			t.Run("CancelStopsPut", func(t *testing.T) {
				s := open(t)
				cctx, cancel := context.WithCancel(ctx)
				defer cancel()
				// An endless source that cancels the Put after 1 MiB: only
				// cancellation can end this Put, and it must not succeed.
				src := &cancellingReader{after: 17 << 20, cancel: cancel}
				done := make(chan error, 1)
				go func() { done <- s.Put(cctx, "c", src, 20<<20) }()
				select {
				case err := <-done:
					if !errors.Is(err, context.Canceled) {
						t.Fatalf("put = %v, want context.Canceled", err)
					}
				case <-time.After(30 * time.Second):
					t.Fatal("put did not stop within 30s of cancellation")
				}
				if read := src.read.Load(); read >= 20<<20 {
					t.Fatalf("put read all %d bytes despite cancellation", read)
				}
				if _, err := s.Stat(ctx, "c"); !errors.Is(err, ErrNotFound) {
					t.Fatalf("stat after cancelled put: %v", err)
				}
				if err := s.Put(cctx, "c2", strings.NewReader("x"), 1); !errors.Is(err, context.Canceled) {
					t.Fatalf("put with cancelled context = %v", err)
				}
				if l, _ := s.List(ctx, ""); len(l) != 0 {
					t.Fatalf("list after cancelled puts = %v", keys(l))
				}
				if s3fx != nil {
					// The upload got past its first 16 MiB part before the
					// cancel; it must have been aborted, not left to be billed.
					if n := s3fx.incompleteUploads(t, s.(*S3), "c"); n != 0 {
						t.Errorf("%d incomplete multipart uploads left", n)
					}
				}
			})

			t.Run("ConditionalPut", func(t *testing.T) {
				s := open(t)
				str := func(v string) *strings.Reader { return strings.NewReader(v) }
				if err := s.PutIf(ctx, "rec", str("v1"), 2, ""); err != nil {
					t.Fatalf("create: %v", err)
				}
				if err := s.PutIf(ctx, "rec", str("v2"), 2, ""); !errors.Is(err, ErrPrecondition) {
					t.Fatalf("second create: %v, want ErrPrecondition", err)
				}
				rc, in, err := s.GetTagged(ctx, "rec")
				if err != nil || in.ETag == "" {
					t.Fatalf("GetTagged: %v %+v", err, in)
				}
				rc.Close()
				if err := s.PutIf(ctx, "rec", str("v3"), 2, in.ETag); err != nil {
					t.Fatalf("replace if unchanged: %v", err)
				}
				if err := s.PutIf(ctx, "rec", str("v4"), 2, in.ETag); !errors.Is(err, ErrPrecondition) {
					t.Fatalf("replace with a stale tag: %v, want ErrPrecondition", err)
				}
				if err := s.PutIf(ctx, "gone", str("v"), 1, in.ETag); !errors.Is(err, ErrPrecondition) {
					t.Fatalf("replace of a missing object: %v, want ErrPrecondition", err)
				}
				if got := get(t, s, "rec"); string(got) != "v3" {
					t.Fatalf("object = %q", got)
				}
				// Concurrent read-modify-write loops: every increment lands.
				if err := s.PutIf(ctx, "counter", str("0"), 1, ""); err != nil {
					t.Fatal(err)
				}
				const writers, each = 4, 5
				var wg sync.WaitGroup
				for w := 0; w < writers; w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := 0; i < each; i++ {
							for {
								rc, in, err := s.GetTagged(ctx, "counter")
								if err != nil {
									t.Error(err)
									return
								}
								b, _ := io.ReadAll(rc)
								rc.Close()
								n, _ := strconv.Atoi(string(b))
								v := strconv.Itoa(n + 1)
								err = s.PutIf(ctx, "counter", str(v), int64(len(v)), in.ETag)
								if err == nil {
									break
								}
								if !errors.Is(err, ErrPrecondition) {
									t.Error(err)
									return
								}
							}
						}
					}()
				}
				wg.Wait()
				if got := get(t, s, "counter"); string(got) != strconv.Itoa(writers*each) {
					t.Fatalf("counter = %s after %d increments", got, writers*each)
				}
			})

			t.Run("CleanTempKeepsLocks", func(t *testing.T) {
				fsStore, ok := open(t).(*FS)
				if !ok {
					t.Skip("file store only")
				}
				if err := fsStore.PutIf(ctx, "r", strings.NewReader("x"), 1, ""); err != nil {
					t.Fatal(err)
				}
				old := time.Now().Add(-time.Hour)
				lock := filepath.Join(fsStore.root, ".lock-r")
				half := filepath.Join(fsStore.root, ".put-123")
				os.WriteFile(half, []byte("half"), 0o644)
				os.Chtimes(lock, old, old)
				os.Chtimes(half, old, old)
				if _, err := fsStore.CleanTemp(time.Minute); err != nil {
					t.Fatal(err)
				}
				if _, err := os.Stat(lock); err != nil {
					t.Errorf("a lock file was removed (a held lock would then let two writers in): %v", err)
				}
				if _, err := os.Stat(half); !os.IsNotExist(err) {
					t.Errorf("a dead writer's temporary file stayed")
				}
			})

			t.Run("Touch", func(t *testing.T) {
				s := open(t)
				put(t, s, "old", []byte("bytes"))
				before, _ := s.Stat(ctx, "old")
				time.Sleep(1100 * time.Millisecond) // S3 modification times have one-second resolution
				if err := s.Touch(ctx, "old"); err != nil {
					t.Fatal(err)
				}
				after, _ := s.Stat(ctx, "old")
				if !after.ModTime.After(before.ModTime) || string(get(t, s, "old")) != "bytes" {
					t.Fatalf("touch: %v -> %v", before.ModTime, after.ModTime)
				}
				if err := s.Touch(ctx, "missing"); !errors.Is(err, ErrNotFound) {
					t.Fatalf("touch of a missing object: %v", err)
				}
			})

			t.Run("FailedPutKeepsOld", func(t *testing.T) {
				s := open(t)
				put(t, s, "k", []byte("old"))
				if err := s.Put(ctx, "k", &failingReader{n: 1000}, 5000); err == nil {
					t.Fatal("put from a failing reader succeeded")
				}
				if err := s.Put(ctx, "new", &failingReader{n: 1000}, 5000); err == nil {
					t.Fatal("put from a failing reader succeeded")
				}
				if got := get(t, s, "k"); string(got) != "old" {
					t.Fatalf("object now %q", got)
				}
				if l, _ := s.List(ctx, ""); strings.Join(keys(l), ",") != "k" {
					t.Fatalf("list = %v", keys(l))
				}
			})
		})
	}
}

// cancellingReader produces bytes without end and cancels its Put's context
// once after bytes have been read.
type cancellingReader struct {
	after  int64
	cancel context.CancelFunc
	read   atomic.Int64
}

func (c *cancellingReader) Read(p []byte) (int, error) {
	// Small reads, as from a network stream, so that the cancel lands in
	// the middle of the body rather than after a single huge read.
	if len(p) > 64<<10 {
		p = p[:64<<10]
	}
	for i := range p {
		p[i] = 'c'
	}
	if c.read.Add(int64(len(p))) >= c.after {
		c.cancel()
	}
	return len(p), nil
}

// assertMultipart checks that the object was stored by a multipart upload:
// S3 ETags of such objects end in -<parts>.
func assertMultipart(t *testing.T, fx *s3Fixture, s *S3, key string) {
	t.Helper()
	c, err := fx.srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	name, _ := s.objectName(key)
	oi, err := c.StatObject(context.Background(), s.bucket, name, miniogo.StatObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(oi.ETag, "-") {
		t.Errorf("%s: ETag %q: not a multipart upload", key, oi.ETag)
	}
}

// incompleteUploads counts unfinished multipart uploads of key, after
// checking with an upload of its own that the listing sees them at all.
func (fx *s3Fixture) incompleteUploads(t *testing.T, s *S3, key string) int {
	t.Helper()
	ctx := context.Background()
	c, err := fx.srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	core := miniogo.Core{Client: c}
	name, _ := s.objectName(key)
	count := func() int {
		n := 0
		for u := range c.ListIncompleteUploads(ctx, s.bucket, name, true) {
			if u.Err != nil {
				t.Fatal(u.Err)
			}
			n++
		}
		return n
	}
	n := count()
	id, err := core.NewMultipartUpload(ctx, s.bucket, name, miniogo.PutObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if m := count(); m != n+1 {
		t.Fatalf("listing incomplete uploads does not work: %d, then %d after starting one", n, m)
	}
	if err := core.AbortMultipartUpload(ctx, s.bucket, name, id); err != nil {
		t.Fatal(err)
	}
	return n
}
