package objectstore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	miniogo "github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/plover-run/plover/errdefs"
	"github.com/plover-run/plover/internal/minio"
)

// storeOps runs every operation of a store on key and returns their
// errors by operation.
func storeOps(ctx context.Context, s Store, key string) map[string]error {
	errs := map[string]error{}
	_, errs["stat"] = s.Stat(ctx, key)
	if rc, err := s.Get(ctx, key); err == nil {
		rc.Close()
	} else {
		errs["get"] = err
	}
	if rc, _, err := s.GetTagged(ctx, key); err == nil {
		rc.Close()
	} else {
		errs["get tagged"] = err
	}
	errs["touch"] = s.Touch(ctx, key)
	errs["put"] = s.Put(ctx, key, bytes.NewReader([]byte("x")), 1)
	errs["put if absent"] = s.PutIf(ctx, key, bytes.NewReader([]byte("x")), 1, "")
	errs["put if match"] = s.PutIf(ctx, key, bytes.NewReader([]byte("x")), 1, `"0123"`)
	_, errs["list"] = s.List(ctx, "functions/")
	errs["delete"] = s.Delete(ctx, key)
	return errs
}

// wantStoreError checks that err is a 503 of kind target, never a missing
// object or a lost race, and that its message names the store, the bucket
// and the words given.
func wantStoreError(t *testing.T, op string, err, target error, words ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error", op)
		return
	}
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrPrecondition) {
		t.Errorf("%s: %v reads as a missing object or a lost race", op, err)
	}
	if !errors.Is(err, target) {
		t.Errorf("%s: %v is not %v", op, err, target)
	}
	if k := errdefs.KindOf(err); k != errdefs.KindUnavailable {
		t.Errorf("%s: %v is of kind %d, want KindUnavailable (503)", op, err, k)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: %q does not say %q", op, err, w)
		}
	}
	// What a client is told (the engine's 503) names none of it.
	if c := ClassOf(err); c == "" || strings.Contains(c, "s3://") || strings.Contains(c, "http") || strings.Contains(c, `bucket "`) {
		t.Errorf("%s: class %q for the client is none, or names where", op, c)
	}
}

// A bucket deleted after the store was opened (on the real MinIO): every
// operation reports the missing bucket, by name, as the store's trouble
// (503); none reads as "object not found", which would answer a 404 for
// every function.
func TestS3DeletedBucket(t *testing.T) {
	srv := minio.Start(t)
	srv.MustCreateBucket(t, "gone-bucket")
	ctx := context.Background()
	s, err := Open(ctx, "s3://gone-bucket/p", s3Options(srv))
	if err != nil {
		t.Fatal(err)
	}
	put(t, s, "functions/f.json", []byte("{}"))
	c, err := srv.Client()
	if err != nil {
		t.Fatal(err)
	}
	// Emptied, then removed: MinIO removes a bucket deleted with force
	// in the background, and in one CI run a conditional put just after
	// found it there again (put if absent landed), in another answered
	// NoSuchKey. A plain removal of an empty bucket is done when answered.
	for o := range c.ListObjects(ctx, "gone-bucket", miniogo.ListObjectsOptions{Recursive: true}) {
		if o.Err != nil {
			t.Fatal(o.Err)
		}
		if err := c.RemoveObject(ctx, "gone-bucket", o.Key, miniogo.RemoveObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.RemoveBucket(ctx, "gone-bucket"); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.BucketExists(ctx, "gone-bucket"); err != nil || ok {
		t.Fatalf("bucket still there: %v, %v", ok, err)
	}
	ageBucket(s.(*S3)) // the put found the bucket; let that be long ago
	for op, err := range storeOps(ctx, s, "functions/f.json") {
		if op == "delete" && err == nil {
			continue // deleting what is not there is no error
		}
		wantStoreError(t, op, err, ErrNoBucket, "s3://gone-bucket/p", `bucket "gone-bucket" does not exist`)
	}
}

// ageBucket moves s's clock past bucketTTL: the last request that found
// the bucket there is long past.
func ageBucket(s *S3) {
	later := time.Now().Add(bucketTTL)
	s.now = func() time.Time { return later }
}

// fakeS3 answers as AWS S3 does: HEAD responses carry no body (so no
// error code), other errors an XML body. status(r) is the answer to each
// request (0: the bucket exists and the object does not).
type fakeS3 struct {
	mu       sync.Mutex
	requests int
	answer   func(r *http.Request) (status int, code string)
}

func (f *fakeS3) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests++
	f.mu.Unlock()
	status, code := f.answer(r)
	if status == http.StatusOK {
		w.WriteHeader(status)
		return
	}
	if r.Method == http.MethodHead {
		w.WriteHeader(status)
		return
	}
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>` + code + `</Code><Message>` + code + `</Message></Error>`))
}

func (f *fakeS3) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests
}

// openFake opens bucket "bkt" on a fake S3 that lets the open check (HEAD
// on the bucket) pass, then answers with answer.
func openFake(t *testing.T, answer func(r *http.Request) (int, string)) (*S3, *fakeS3) {
	t.Helper()
	noS3Env(t)
	opened := false
	f := &fakeS3{}
	f.answer = func(r *http.Request) (int, string) {
		if !opened {
			return http.StatusOK, ""
		}
		return answer(r)
	}
	ts := httptest.NewServer(f)
	t.Cleanup(ts.Close)
	s, err := NewS3(context.Background(), "bkt", "", S3Options{Endpoint: ts.URL, Region: "us-east-1", AccessKey: "a", SecretKey: "s"})
	if err != nil {
		t.Fatal(err)
	}
	opened = true
	return s, f
}

// isBucket is whether r is addressed to the bucket itself (path style).
func isBucket(r *http.Request) bool { return strings.Trim(r.URL.Path, "/") == "bkt" }

// AWS answers a HEAD on an object of a bucket that does not exist with a
// bare 404, which minio-go reads as NoSuchKey: the store must tell a
// missing bucket from a missing object, and still report a missing
// object as ErrNotFound.
func TestS3Bare404(t *testing.T) {
	ctx := context.Background()
	t.Run("bucket gone", func(t *testing.T) {
		s, _ := openFake(t, func(r *http.Request) (int, string) { return http.StatusNotFound, "NoSuchBucket" })
		// Deleted longer than bucketTTL ago (within it, a HEAD's bare
		// 404 reads as a missing object: TestS3DeletedBucketWhileRemembered).
		ageBucket(s)
		for op, err := range storeOps(ctx, s, "functions/f.json") {
			if op == "delete" && err == nil {
				continue
			}
			wantStoreError(t, op, err, ErrNoBucket, "s3://bkt", `bucket "bkt" does not exist`)
		}
	})
	t.Run("object missing", func(t *testing.T) {
		s, _ := openFake(t, func(r *http.Request) (int, string) {
			if isBucket(r) {
				return http.StatusOK, ""
			}
			return http.StatusNotFound, "NoSuchKey"
		})
		_, serr := s.Stat(ctx, "functions/f.json")
		_, gerr := s.Get(ctx, "functions/f.json")
		_, _, terr := s.GetTagged(ctx, "functions/f.json")
		for op, err := range map[string]error{"stat": serr, "get": gerr, "get tagged": terr} {
			if !errors.Is(err, ErrNotFound) {
				t.Errorf("%s: %v, want ErrNotFound", op, err)
			}
		}
	})
}

// S3 refusing the credentials or the request (403, with a code or bare as
// on a HEAD): a 503 that names the store and bucket and says access was
// denied and what to check; never a missing object, and sent once, not
// retried.
func TestS3AccessDenied(t *testing.T) {
	ctx := context.Background()
	for _, code := range []string{"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"} {
		t.Run(code, func(t *testing.T) {
			s, f := openFake(t, func(r *http.Request) (int, string) { return http.StatusForbidden, code })
			before := f.count() // the open check
			ops := storeOps(ctx, s, "functions/f.json")
			for op, err := range ops {
				wantStoreError(t, op, err, ErrAccessDenied, "s3://bkt", `bucket "bkt"`, "access denied", "check the credentials")
			}
			// Each operation sends exactly one request: none is retried,
			// and a 403 (no not-found) asks no bucket check.
			if n := f.count() - before; n != len(ops) {
				t.Errorf("%d requests for %d operations, want one each: 403s were retried or checked", n, len(ops))
			}
		})
	}
	t.Run("real MinIO, wrong secret", func(t *testing.T) {
		srv := minio.Start(t)
		srv.MustCreateBucket(t, "denied")
		s, err := NewS3(ctx, "denied", "", s3Options(srv))
		if err != nil {
			t.Fatal(err)
		}
		// The secret changed (rotated) after the store was opened.
		s.client, err = miniogo.New(srv.Addr, &miniogo.Options{
			Creds:        credentials.NewStaticV4(srv.AccessKey, srv.SecretKey+"x", ""),
			BucketLookup: miniogo.BucketLookupPath,
			Region:       "us-east-1",
		})
		if err != nil {
			t.Fatal(err)
		}
		for op, err := range storeOps(ctx, s, "functions/f.json") {
			wantStoreError(t, op, err, ErrAccessDenied, "s3://denied", `bucket "denied"`, "access denied", "check the credentials")
		}
	})
}

// missingObject answers a HEAD on the bucket 200 and a HEAD on any object
// a bare 404 (the object does not exist), counting bucket HEADs.
func missingObject(bucketHeads *int, mu *sync.Mutex) func(r *http.Request) (int, string) {
	return func(r *http.Request) (int, string) {
		if isBucket(r) {
			mu.Lock()
			*bucketHeads++
			mu.Unlock()
			return http.StatusOK, ""
		}
		return http.StatusNotFound, "NoSuchKey"
	}
}

// A missing object (every lookup of an unknown function name) costs one
// request while the bucket was seen lately, not two: the bucket HEAD that
// tells a deleted bucket from a missing object is sent once per
// bucketTTL, not on every miss.
func TestS3MissesCheckTheBucketOncePerTTL(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	bucketHeads := 0
	s, f := openFake(t, missingObject(&bucketHeads, &mu))
	clock := time.Now()
	s.now = func() time.Time { return clock }
	clock = clock.Add(time.Hour) // the open check is long past
	const n = 10
	before := f.count()
	for i := 0; i < n; i++ {
		if _, err := s.Stat(ctx, "functions/f.json"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("miss %d: %v, want ErrNotFound", i, err)
		}
	}
	if got := f.count() - before; got != n+1 {
		t.Errorf("%d misses cost %d requests, want %d (one bucket check)", n, got, n+1)
	}
	mu.Lock()
	if bucketHeads != 1 {
		t.Errorf("%d bucket checks for %d misses, want 1", bucketHeads, n)
	}
	mu.Unlock()
	// Past the cache time the bucket is asked again.
	clock = clock.Add(bucketTTL)
	before = f.count()
	if _, err := s.Stat(ctx, "functions/f.json"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("miss after the cache time: %v, want ErrNotFound", err)
	}
	if got := f.count() - before; got != 2 {
		t.Errorf("a miss after the cache time cost %d requests, want 2 (object, bucket)", got)
	}
	// A request that succeeded confirms the bucket too.
	clock = clock.Add(bucketTTL)
	s2, f2 := openFake(t, func(r *http.Request) (int, string) {
		if r.Method == http.MethodPut {
			return http.StatusOK, ""
		}
		return http.StatusNotFound, "NoSuchKey"
	})
	s2.now = s.now
	if err := s2.Put(ctx, "functions/g.json", bytes.NewReader([]byte("x")), 1); err != nil {
		t.Fatal(err)
	}
	before = f2.count()
	if _, err := s2.Stat(ctx, "functions/f.json"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("miss after a put: %v, want ErrNotFound", err)
	}
	if got := f2.count() - before; got != 1 {
		t.Errorf("a miss after a successful put cost %d requests, want 1", got)
	}
}

// A bucket deleted while the store remembers it: a HEAD's bare 404 reads
// as a missing object for at most bucketTTL (documented), but any
// request that gets NoSuchBucket forgets the bucket, and past bucketTTL
// the bucket check finds it gone.
func TestS3DeletedBucketWhileRemembered(t *testing.T) {
	ctx := context.Background()
	s, _ := openFake(t, func(r *http.Request) (int, string) { return http.StatusNotFound, "NoSuchBucket" })
	clock := time.Now()
	s.now = func() time.Time { return clock }
	s.sawBucket()
	if _, err := s.Stat(ctx, "functions/f.json"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("stat within the cache time: %v, want ErrNotFound (the documented window)", err)
	}
	if _, err := s.List(ctx, "functions/"); !errors.Is(err, ErrNoBucket) {
		t.Fatalf("list: %v, want ErrNoBucket", err)
	}
	_, err := s.Stat(ctx, "functions/f.json")
	wantStoreError(t, "stat after a NoSuchBucket", err, ErrNoBucket, `bucket "bkt" does not exist`)

	s.sawBucket()
	clock = clock.Add(bucketTTL)
	_, err = s.Stat(ctx, "functions/f.json")
	wantStoreError(t, "stat past the cache time", err, ErrNoBucket, `bucket "bkt" does not exist`)
}

// An object HEAD's 404 followed by a bucket HEAD that fails: a 403 is
// the store's trouble (503, access denied); a 5xx or a deadline leaves
// the object's answer, not found, and is not remembered as the bucket
// being there.
func TestS3BucketCheckFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		hang   bool
	}{{"403", http.StatusForbidden, false}, {"503", http.StatusServiceUnavailable, false}, {"deadline", 0, true}} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			bucketHeads := 0
			s, _ := openFake(t, func(r *http.Request) (int, string) {
				if !isBucket(r) {
					return http.StatusNotFound, "NoSuchKey"
				}
				mu.Lock()
				bucketHeads++
				mu.Unlock()
				if tc.hang {
					<-r.Context().Done()
					return http.StatusServiceUnavailable, ""
				}
				return tc.status, ""
			})
			// One try: minio-go retries a 5xx for seconds.
			c, err := miniogo.New(strings.TrimPrefix(s.endpoint, "http://"), &miniogo.Options{
				Creds: credentials.NewStaticV4("a", "s", ""), BucketLookup: miniogo.BucketLookupPath,
				Region: "us-east-1", MaxRetries: 1,
			})
			if err != nil {
				t.Fatal(err)
			}
			s.client = c
			clock := time.Now().Add(time.Hour) // the open check is long past
			s.now = func() time.Time { return clock }
			for i := 0; i < 2; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if tc.hang {
					ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
				}
				_, err := s.Stat(ctx, "functions/f.json")
				cancel()
				if tc.status == http.StatusForbidden {
					wantStoreError(t, "stat", err, ErrAccessDenied, "s3://bkt", `bucket "bkt"`, "access")
				} else {
					if !errors.Is(err, ErrNotFound) || errdefs.KindOf(err) == errdefs.KindUnavailable {
						t.Fatalf("stat: %v (kind %d), want ErrNotFound", err, errdefs.KindOf(err))
					}
					if tc.hang && !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("stat: %v: the check's deadline is not kept (errors.Is DeadlineExceeded)", err)
					}
					for _, w := range []string{"s3://bkt", `bucket "bkt"`, `object "functions/f.json"`} {
						if !strings.Contains(err.Error(), w) {
							t.Errorf("stat: %q does not say %q", err, w)
						}
					}
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if bucketHeads != 2 {
				t.Errorf("%d bucket checks for 2 misses, want 2: a failed check was remembered", bucketHeads)
			}
		})
	}
}

// A 403 is not always a refusal of the credentials: AWS answers an
// archived object (InvalidObjectState: a copy, as Touch makes, or a read of
// an object in S3 Glacier) and a request signed with a clock too far off
// (RequestTimeTooSkewed) with 403 too. Each says what it is (still a 503:
// the store's trouble), and only a real denial is ErrAccessDenied.
func TestS3ForbiddenCodes(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		code   string
		denied bool
		words  []string
	}{
		{"AccessDenied", true, []string{"access denied", "check the credentials"}},
		{"InvalidAccessKeyId", true, []string{"access denied", "check the credentials"}},
		{"InvalidObjectState", false, []string{"archived", "restore"}},
		{"RequestTimeTooSkewed", false, []string{"clock", "sync"}},
	} {
		t.Run(tc.code, func(t *testing.T) {
			s, _ := openFake(t, func(r *http.Request) (int, string) { return http.StatusForbidden, tc.code })
			// The requests with a body (a HEAD's 403 has no code to
			// tell).
			errs := map[string]error{
				"touch":         s.Touch(ctx, "functions/f.json"),
				"put":           s.Put(ctx, "functions/f.json", bytes.NewReader([]byte("x")), 1),
				"put if absent": s.PutIf(ctx, "functions/f.json", bytes.NewReader([]byte("x")), 1, ""),
				"delete":        s.Delete(ctx, "functions/f.json"),
			}
			_, errs["list"] = s.List(ctx, "functions/")
			for op, err := range errs {
				if err == nil {
					t.Errorf("%s: no error", op)
					continue
				}
				if errors.Is(err, ErrAccessDenied) != tc.denied {
					t.Errorf("%s: %v: errors.Is(ErrAccessDenied) = %v, want %v", op, err, !tc.denied, tc.denied)
				}
				if errors.Is(err, ErrNotFound) || errors.Is(err, ErrPrecondition) {
					t.Errorf("%s: %v reads as a missing object or a lost race", op, err)
				}
				if k := errdefs.KindOf(err); k != errdefs.KindUnavailable {
					t.Errorf("%s: %v is of kind %d, want KindUnavailable (503)", op, err, k)
				}
				for _, w := range append([]string{"s3://bkt", `bucket "bkt"`}, tc.words...) {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: %q does not say %q", op, err, w)
					}
				}
				if !tc.denied && strings.Contains(err.Error(), "check the credentials") {
					t.Errorf("%s: %q blames the credentials", op, err)
				}
			}
		})
	}
}

// An object deleted between GetTagged's HEAD and the GET that reads it
// (AWS answers that GET 404 NoSuchKey) reads as missing, ErrNotFound, as
// one deleted before: a record deleted elsewhere is a function gone, not
// a store failure that fails every listing reading it.
func TestS3ObjectDeletedWhileRead(t *testing.T) {
	noS3Env(t)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case isBucket(r):
			w.WriteHeader(http.StatusOK)
		case r.Method == http.MethodHead:
			w.Header().Set("ETag", `"0123"`)
			w.Header().Set("Last-Modified", time.Now().UTC().Format(http.TimeFormat))
			w.Header().Set("Content-Length", "2")
			w.WriteHeader(http.StatusOK)
		default: // the GET, conditioned on the HEAD's ETag: deleted since
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message></Error>`))
		}
	}))
	t.Cleanup(ts.Close)
	s, err := NewS3(context.Background(), "bkt", "", S3Options{Endpoint: ts.URL, Region: "us-east-1", AccessKey: "a", SecretKey: "s"})
	if err != nil {
		t.Fatal(err)
	}
	rc, _, err := s.GetTagged(context.Background(), "functions/fn.json")
	if err != nil {
		t.Fatalf("get tagged: %v (the HEAD found it)", err)
	}
	defer rc.Close()
	if _, err := io.ReadAll(rc); !errors.Is(err, ErrNotFound) {
		t.Fatalf("read of an object deleted after the HEAD: %v, want ErrNotFound", err)
	}
}

// A conditional PUT that AWS answers 409 ConditionalRequestConflict (a
// write or delete of the key in flight beside it) is a lost race, as a
// 412 is: the record's update reads again and retries. It was a 503
// naming the code, and a deploy racing another node's failed.
func TestS3ConditionalConflictIsALostRace(t *testing.T) {
	for _, tc := range []struct {
		status int
		code   string
	}{
		{http.StatusPreconditionFailed, "PreconditionFailed"},
		{http.StatusConflict, "ConditionalRequestConflict"},
	} {
		s, f := openFake(t, func(r *http.Request) (int, string) { return tc.status, tc.code })
		for _, ifMatch := range []string{"", `"0123"`} {
			before := f.count()
			err := s.PutIf(context.Background(), "functions/f.json", bytes.NewReader([]byte("x")), 1, ifMatch)
			if !errors.Is(err, ErrPrecondition) {
				t.Errorf("%d %s, if-match %q: %v, want ErrPrecondition", tc.status, tc.code, ifMatch, err)
			}
			if n := f.count() - before; n != 1 {
				t.Errorf("%d %s: %d requests, want 1 (the caller reads again, then retries)", tc.status, tc.code, n)
			}
		}
	}
}
