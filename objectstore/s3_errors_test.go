package objectstore

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

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
	if err := c.RemoveBucketWithOptions(ctx, "gone-bucket", miniogo.RemoveBucketOptions{ForceDelete: true}); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.BucketExists(ctx, "gone-bucket"); err != nil || ok {
		t.Fatalf("bucket still there: %v, %v", ok, err)
	}
	for op, err := range storeOps(ctx, s, "functions/f.json") {
		if op == "delete" && err == nil {
			continue // deleting what is not there is no error
		}
		wantStoreError(t, op, err, ErrNoBucket, "s3://gone-bucket/p", `bucket "gone-bucket" does not exist`)
	}
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
			for op, err := range storeOps(ctx, s, "functions/f.json") {
				wantStoreError(t, op, err, ErrAccessDenied, "s3://bkt", `bucket "bkt"`, "access denied", "check the credentials")
			}
			// Each operation sends one request, or two (a bucket check
			// after a not-found), none retried: 9 operations.
			if n := f.count(); n > 2*9 {
				t.Errorf("%d requests for 9 operations: 403s were retried", n)
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
