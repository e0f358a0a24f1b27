// Package objectstore keeps deployed bundles and function records behind a
// small Store interface; the filesystem backend is the default.
package objectstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// ErrNotFound is returned (wrapped) for a key that does not exist.
var ErrNotFound = errors.New("object not found")

// ErrNoBucket is returned (wrapped) when the store's bucket does not exist
// (deleted or renamed since the store was opened): the store's trouble,
// never a missing object.
var ErrNoBucket = errors.New("no such bucket")

// ErrAccessDenied is returned (wrapped) when the store refuses the
// credentials or the request (S3's 403): a configuration error of the
// server, never a missing object.
var ErrAccessDenied = errors.New("access denied")

// Store is a flat key/value object store. Keys are slash-separated paths of
// [A-Za-z0-9._-] segments; no segment may be "." or "..".
type Store interface {
	// Put stores size bytes from r under key, replacing any object there;
	// readers see the old object or the new one, never a partial one.
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	// Get streams an object; the caller closes it.
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	Stat(ctx context.Context, key string) (Info, error)
	// List returns the objects whose keys start with prefix, sorted by key.
	List(ctx context.Context, prefix string) ([]Info, error)
	// Delete removes key; deleting a missing key is not an error.
	Delete(ctx context.Context, key string) error
	// GetTagged is Get that also returns the object's Info, whose ETag a
	// later PutIf can be conditioned on.
	GetTagged(ctx context.Context, key string) (io.ReadCloser, Info, error)
	// PutIf is Put under a condition on the object there now: ifMatch ""
	// creates key only if it does not exist; otherwise key is replaced only
	// if its ETag is still ifMatch. A failed condition is ErrPrecondition.
	// (S3: If-None-Match: * and If-Match on the PUT; files: a lock file.)
	PutIf(ctx context.Context, key string, r io.Reader, size int64, ifMatch string) error
	// Touch sets an object's modification time to now, keeping its bytes,
	// so that a grace period measured from it starts again.
	Touch(ctx context.Context, key string) error
	// String names the store for logs, e.g. file:///var/lib/plover/store.
	String() string
}

// Info describes one object.
type Info struct {
	Key     string
	Size    int64
	ModTime time.Time
	// ETag changes whenever the object is written (an opaque version tag;
	// for S3 the object's ETag, for files inode, size and time).
	ETag string
}

// ErrPrecondition is returned (wrapped) by PutIf when the object is not in
// the state the condition names: another writer got there first.
var ErrPrecondition = errors.New("the object changed (conditional write refused)")

// CheckKey rejects keys that could escape a store's root or are not portable
// between backends.
func CheckKey(key string) error {
	if key == "" || len(key) > 512 {
		return fmt.Errorf("object key %q: must be 1..512 bytes", key)
	}
	for seg := range strings.SplitSeq(key, "/") {
		if !validSegment(seg) {
			return fmt.Errorf("object key %q: segment %q is not [A-Za-z0-9_][A-Za-z0-9._-]*", key, seg)
		}
	}
	return nil
}

// validSegment is whether seg matches [A-Za-z0-9_][A-Za-z0-9._-]*, by byte
// class rather than a regexp: a file store's listing checks every key it
// finds, a thousand records on each GET /v1/functions.
func validSegment(seg string) bool {
	if seg == "" {
		return false
	}
	for i := 0; i < len(seg); i++ {
		switch c := seg[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_':
		case (c == '.' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return true
}

// Open returns the store a URL names: file:///abs/path, a plain path, or
// s3://bucket[/prefix], for which s3 says how to reach the service (empty
// fields come from the environment, see NewS3). An S3 store is checked for
// reachability, credentials and the bucket before Open returns.
func Open(ctx context.Context, rawURL string, s3 S3Options) (Store, error) {
	switch {
	case strings.HasPrefix(rawURL, "file://"):
		// Callers build file://DIR from a possibly relative --data, so what
		// follows file:// is taken as a path, not as host and path.
		return NewFS(strings.TrimPrefix(rawURL, "file://"))
	case strings.HasPrefix(rawURL, "s3://"):
		bucket, prefix, err := parseS3URL(rawURL)
		if err != nil {
			return nil, err
		}
		return NewS3(ctx, bucket, prefix, s3)
	case strings.Contains(rawURL, "://"):
		return nil, fmt.Errorf("store %q: unsupported scheme (want file://, s3:// or a path)", redactURL(rawURL))
	default:
		return NewFS(rawURL)
	}
}

// parseS3URL splits s3://bucket[/prefix]. Its errors name the URL as
// redactURL shows it.
func parseS3URL(rawURL string) (bucket, prefix string, err error) {
	shown := redactURL(rawURL)
	rest := strings.TrimPrefix(rawURL, "s3://")
	if strings.Contains(rest, "@") {
		// No bucket or prefix holds one: this is s3://KEY:SECRET@bucket.
		return "", "", fmt.Errorf("store %q: an s3:// URL holds no user or password (\"@\"): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", shown)
	}
	if strings.ContainsAny(rest, "?#") {
		return "", "", fmt.Errorf("store %q: s3:// URLs take no query or fragment", shown)
	}
	bucket, prefix, _ = strings.Cut(rest, "/")
	if bucket == "" {
		return "", "", fmt.Errorf("store %q: empty bucket name (want s3://bucket[/prefix])", shown)
	}
	if err := checkBucket(bucket); err != nil {
		return "", "", fmt.Errorf("store %q: %w", shown, err)
	}
	prefix = strings.Trim(prefix, "/")
	if prefix != "" {
		if err := CheckKey(prefix); err != nil {
			return "", "", fmt.Errorf("store %q: prefix: %w", shown, err)
		}
	}
	return bucket, prefix, nil
}

// redactURL is a store URL (or a bucket) as an error shows it: a user and
// password before the host as "xxxxx@", and no query or fragment. Errors
// reach logs and a command's output, and a mistyped URL may carry
// credentials (s3://KEY:SECRET@bucket, s3://bucket?secret_key=...).
//
// The user and password go up to the last "@", not the first "/": an AWS
// secret key may hold a "/". Where a "?" or "#" comes before that "@",
// which of the two the secret lies in cannot be told, and nothing after
// the scheme is shown.
func redactURL(raw string) string {
	scheme, rest, hasScheme := strings.Cut(raw, "://")
	if !hasScheme {
		rest = raw
	}
	q := strings.IndexAny(rest, "?#")
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		if q >= 0 && q < at {
			rest = "xxxxx@"
		} else {
			rest = "xxxxx" + rest[at:]
		}
	}
	if q := strings.IndexAny(rest, "?#"); q >= 0 {
		rest = rest[:q]
	}
	if !hasScheme {
		return rest
	}
	return scheme + "://" + rest
}

// ctxReader stops a long copy when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
