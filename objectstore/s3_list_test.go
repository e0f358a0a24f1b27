package objectstore

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// listingServer answers every ListObjectsV2 with one page of keys, truncated
// (a next page, the same token each time) or not, and any other request
// (the bucket's check) with 200.
func listingServer(t *testing.T, keys []string, truncated bool) (*S3, *atomic.Int64) {
	t.Helper()
	noS3Env(t)
	var b strings.Builder
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>bkt</Name><IsTruncated>%t</IsTruncated>`, truncated)
	if truncated {
		b.WriteString(`<NextContinuationToken>same</NextContinuationToken>`)
	}
	for _, k := range keys {
		fmt.Fprintf(&b, `<Contents><Key>%s</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified><ETag>"x"</ETag><Size>1</Size></Contents>`, k)
	}
	b.WriteString(`</ListBucketResult>`)
	page := []byte(b.String())
	var pages atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("list-type") {
			pages.Add(1)
			w.Write(page)
		}
	}))
	t.Cleanup(ts.Close)
	s, err := NewS3(context.Background(), "bkt", "", S3Options{Endpoint: ts.URL, Region: "us-east-1", AccessKey: "a", SecretKey: "s"})
	if err != nil {
		t.Fatal(err)
	}
	return s, &pages
}

// An endpoint that ignores a listing's prefix (a gateway or a cache keyed
// by path; a review's probe behind real MinIO): gc took every key listed
// under bundles/ for a bundle, and deleted a live function's record as an
// unused one. Only keys under the prefix asked for are listed.
func TestS3ListKeepsToItsPrefix(t *testing.T) {
	s, _ := listingServer(t, []string{"bundles/abc.tar.zst", "deleting/m1", "functions/victim.json", "other-app/data"}, false)
	got, err := s.List(context.Background(), "bundles/")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Key != "bundles/abc.tar.zst" {
		t.Fatalf("List(bundles/) from an endpoint ignoring the prefix: %v, want bundles/abc.tar.zst alone", got)
	}
}

// An endpoint whose pages never end (each truncated, with the same token)
// listed half a million keys in 5 s, all kept, until the caller's deadline
// or the node's memory ran out. A listing is refused past maxListed
// objects, counted whether in its prefix or not.
func TestS3ListIsBounded(t *testing.T) {
	defer func(n int) { maxListed = n }(maxListed)
	maxListed = 5000
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("functions/f%04d.json", i)
	}
	for _, prefix := range []string{"functions/", "bundles/"} {
		s, pages := listingServer(t, keys, true)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		got, err := s.List(ctx, prefix)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "over 5000 objects listed") || got != nil {
			t.Fatalf("List(%s) of endless pages: %d keys, %v; want refused past 5000 objects", prefix, len(got), err)
		}
		if n := pages.Load(); n > 7 { // the 6th page passes the bound; one more may be in flight
			t.Errorf("List(%s) read %d pages for a bound of 5 pages' keys", prefix, n)
		}
	}
}
